package protocol

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Fixed keys of the golden vectors: the seeds of RFC 8032, section 7.1, tests 1 and 2.
func testKey(t testing.TB, seedHex string) ed25519.PrivateKey {
	t.Helper()
	seed, err := hex.DecodeString(seedHex)
	if err != nil {
		t.Fatal(err)
	}
	return ed25519.NewKeyFromSeed(seed)
}

const (
	bridgeSeed = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"
	agentSeed  = "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb"
)

func testSigners(t testing.TB) (bridge, agent *Signer, ring *Keyring) {
	t.Helper()
	bk, ak := testKey(t, bridgeSeed), testKey(t, agentSeed)
	bridge, err := NewSigner("bridge-test", bk)
	if err != nil {
		t.Fatal(err)
	}
	agent, err = NewSigner("agent-compute-0012", ak)
	if err != nil {
		t.Fatal(err)
	}
	ring, err = NewKeyring(TrustedKey{ID: "bridge-test", Key: bridge.PublicKey()},
		TrustedKey{ID: "agent-compute-0012", Key: agent.PublicKey(), Host: "compute-0012"})
	if err != nil {
		t.Fatal(err)
	}
	return bridge, agent, ring
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "sign", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s changed; the signed form is a contract.\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// TestSignGolden recomputes the golden vectors in testdata/sign: the key
// files, and for a command, a result and a report the exact signing input
// and the signed body. Run with -update to rewrite them.
func TestSignGolden(t *testing.T) {
	bridge, agent, ring := testSigners(t)
	priv, err := MarshalPrivateKey(bridge.key)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "bridge.key", priv)
	var kr []byte
	for _, k := range ring.Keys() {
		b, err := MarshalTrustedKey(k)
		if err != nil {
			t.Fatal(err)
		}
		kr = append(kr, b...)
	}
	golden(t, "keyring.pem", kr)

	m := messages(t)
	c := m["command_attach_vgpu"].(Command)
	res := m["result_succeeded"].(Result)
	rep := m["report"].(Report)
	for _, tc := range []struct {
		name string
		typ  MessageType
		sign func() (any, error)
	}{
		{"command", TypeCommand, func() (any, error) { return c, bridge.SignCommand(&c) }},
		{"result", TypeResult, func() (any, error) { return res, agent.SignResult(&res) }},
		{"report", TypeReport, func() (any, error) { return rep, agent.SignReport(&rep) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := tc.sign()
			if err != nil {
				t.Fatal(err)
			}
			body, _ := json.Marshal(v)
			in, err := SigningInput(tc.typ, body)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name+".input", in)
			golden(t, tc.name+".json", append(body, '\n'))
			// The stored vectors verify on their own, whatever the structs
			// become, and so does the body re-indented.
			stored, _ := os.ReadFile(filepath.Join("testdata", "sign", tc.name+".json"))
			if _, err := ring.Verify(tc.typ, stored, issued); err != nil {
				t.Errorf("stored %s does not verify: %v", tc.name, err)
			}
			var pretty bytes.Buffer
			_ = json.Indent(&pretty, stored, "", "    ")
			if _, err := ring.Verify(tc.typ, pretty.Bytes(), issued); err != nil {
				t.Errorf("re-indented %s does not verify: %v", tc.name, err)
			}
		})
	}
	// The key files parse back to the same keys.
	s, err := ParseSigner(priv, "bridge-test")
	if err != nil || s.KeyID() != "bridge-test" || !s.PublicKey().Equal(bridge.PublicKey()) {
		t.Errorf("ParseSigner: %v %+v", err, s)
	}
	back, err := ParseKeyring(kr)
	if err != nil || back.Len() != 2 || back.Keys()[0].Host != "compute-0012" {
		t.Errorf("ParseKeyring: %v %+v", err, back)
	}
}

// TestCanonicalRFC8785 uses the example of RFC 8785, section 3.2.2 (sig removed).
func TestCanonicalRFC8785(t *testing.T) {
	in := `{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false],
  "sig": "removed",
  "\u00e9": 1, "\ud83d\ude00": 2, "\uffff": 3, "z": -0.0
}`
	want := `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],` +
		`"string":"€$\u000f\nA'B\"\\\\\"/","z":0,"é":1,"😀":2,"` + "\uffff" + `":3}`
	got, err := Canonical([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestCanonicalRejects(t *testing.T) {
	for name, in := range map[string]string{
		"not object": `[1]`,
		"duplicate":  `{"host":"a","host":"b"}`,
		"trailing":   `{"a":1} {"b":2}`,
		"huge":       `{"a":1e999}`,
		"deep":       `{"a":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`,
		"broken":     `{"a":`,
	} {
		if _, err := Canonical([]byte(in)); err == nil {
			t.Errorf("%s: accepted %s", name, in)
		}
	}
}

func TestVerify(t *testing.T) {
	bridge, agent, ring := testSigners(t)
	other, _ := NewSigner("bridge-test", testKey(t, strings.Repeat("11", 32))) // same id, another key
	m := messages(t)
	sign := func(s *Signer, edit func(c *Command)) []byte {
		c := m["command_create_mdev"].(Command)
		if edit != nil {
			edit(&c)
		}
		if s != nil {
			if err := s.SignCommand(&c); err != nil {
				t.Fatal(err)
			}
		}
		b, _ := json.Marshal(c)
		return b
	}
	valid := sign(bridge, nil)
	tamper := func(old, new string) []byte { return bytes.Replace(valid, []byte(old), []byte(new), 1) }
	agentSigned := func() []byte {
		c := m["command_create_mdev"].(Command)
		_ = agent.SignCommand(&c)
		b, _ := json.Marshal(c)
		return b
	}()
	res := m["result_succeeded"].(Result)
	_ = agent.SignResult(&res)
	resBody, _ := json.Marshal(res)
	resOther := res
	resOther.Host = "compute-0099"
	_ = agent.SignResult(&resOther)
	resOtherBody, _ := json.Marshal(resOther)
	withField := bytes.Replace(valid, []byte(`{`), []byte(`{"new_field":"x",`), 1)

	for _, tc := range []struct {
		name     string
		typ      MessageType
		body     []byte
		code     string
		unsigned bool
	}{
		{"valid", TypeCommand, valid, "", false},
		{"unsigned", TypeCommand, sign(nil, nil), CodeBadSignature, true},
		{"host changed", TypeCommand, tamper(`"host":"compute-0012"`, `"host":"compute-0013"`), CodeBadSignature, false},
		{"params changed", TypeCommand, tamper(`nvidia-232`, `nvidia-233`), CodeBadSignature, false},
		{"expiry changed", TypeCommand, tamper(`"expires_at":"2025-03-01T12:05:00Z"`, `"expires_at":"2026-03-01T12:05:00Z"`), CodeBadSignature, false},
		{"field added", TypeCommand, withField, CodeBadSignature, false},
		{"other key same id", TypeCommand, sign(other, nil), CodeBadSignature, false},
		{"sig garbage", TypeCommand, tamper(`"sig":"`, `"sig":"!!`), CodeBadSignature, false},
		{"unknown key", TypeCommand, tamper(`"key_id":"bridge-test"`, `"key_id":"bridge-2031"`), CodeUnknownKey, false},
		{"agent key signs a command", TypeCommand, agentSigned, CodeUnknownKey, false},
		{"command as result", TypeResult, valid, CodeUnknownKey, false},
		{"result", TypeResult, resBody, "", false},
		{"result as report", TypeReport, resBody, CodeBadSignature, false},
		{"result of another host", TypeResult, resOtherBody, CodeUnknownKey, false},
		{"not json", TypeCommand, []byte(`nope`), CodeBadSignature, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ring.Verify(tc.typ, tc.body, issued)
			if got := SignatureCode(err); got != tc.code || IsUnsigned(err) != tc.unsigned {
				t.Errorf("code %q (unsigned %v, %v), want %q (unsigned %v)", got, IsUnsigned(err), err, tc.code, tc.unsigned)
			}
			if tc.code == "" && err != nil {
				t.Errorf("err = %v", err)
			}
		})
	}
}

// TestRotationGrace: a rotated-out key verifies until its Not-After and is
// refused (key_expired) after it; the new key verifies throughout.
func TestRotationGrace(t *testing.T) {
	old, _ := NewSigner("bridge-2025a", testKey(t, bridgeSeed))
	cur, _ := NewSigner("bridge-2025b", testKey(t, strings.Repeat("22", 32)))
	end := issued.Add(time.Hour)
	ring, err := NewKeyring(TrustedKey{ID: old.KeyID(), Key: old.PublicKey(), NotAfter: end},
		TrustedKey{ID: cur.KeyID(), Key: cur.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	c := messages(t)["command_reset_clocks"].(Command)
	_ = old.SignCommand(&c)
	byOld, _ := json.Marshal(c)
	_ = cur.SignCommand(&c)
	byCur, _ := json.Marshal(c)
	for _, tc := range []struct {
		body []byte
		at   time.Time
		code string
	}{
		{byOld, end.Add(-time.Second), ""},
		{byOld, end, ""},
		{byOld, end.Add(time.Second), CodeKeyExpired},
		{byCur, end.Add(time.Second), ""},
	} {
		if _, err := ring.Verify(TypeCommand, tc.body, tc.at); SignatureCode(err) != tc.code {
			t.Errorf("at %s: %v, want code %q", tc.at, err, tc.code)
		}
	}
}

func TestParseKeyringErrors(t *testing.T) {
	_, agent, _ := testSigners(t)
	entry, _ := MarshalTrustedKey(TrustedKey{ID: "a", Key: agent.PublicKey()})
	withHeader := func(h string) string {
		return strings.Replace(string(entry), "Key-Id: a\n", "Key-Id: a\n"+h+"\n", 1)
	}
	for name, in := range map[string]string{
		"duplicate id":     string(entry) + string(entry),
		"misspelt header":  withHeader("Not-after: 2025-01-01T00:00:00Z"),
		"bad not-after":    withHeader("Not-After: tomorrow"),
		"no key id":        strings.Replace(string(entry), "Key-Id: a\n\n", "", 1),
		"private key":      "-----BEGIN PRIVATE KEY-----\nKey-Id: a\n\nAAAA\n-----END PRIVATE KEY-----\n",
		"garbage after":    string(entry) + "hello\n",
		"not ed25519 pkix": "-----BEGIN PUBLIC KEY-----\nKey-Id: a\n\nAAAA\n-----END PUBLIC KEY-----\n",
	} {
		if _, err := ParseKeyring([]byte(in)); err == nil {
			t.Errorf("%s: accepted\n%s", name, in)
		}
	}
	if k, err := ParseKeyring([]byte(withHeader("Not-After: 2025-01-01T00:00:00Z"))); err != nil || k.Keys()[0].NotAfter.Year() != 2025 {
		t.Errorf("Not-After: %v", err)
	}
	if k, err := ParseKeyring(nil); err != nil || k.Len() != 0 {
		t.Errorf("empty keyring: %v", err)
	}
}

func TestLoadKeyFilesChecksPermissions(t *testing.T) {
	dir := t.TempDir()
	priv, pub, err := GenerateKey("agent-h1", "h1")
	if err != nil {
		t.Fatal(err)
	}
	kp, rp := filepath.Join(dir, "agent.key"), filepath.Join(dir, "keyring.pem")
	if err := os.WriteFile(kp, priv, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rp, pub, 0o666); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(rp, 0o666)
	if _, err := LoadSigner(kp, "agent-h1"); err == nil || !strings.Contains(err.Error(), "chmod") {
		t.Errorf("world-readable private key accepted: %v", err)
	}
	if _, err := LoadKeyring(rp); err == nil {
		t.Error("world-writable keyring accepted")
	}
	_ = os.Chmod(kp, 0o640)
	_ = os.Chmod(rp, 0o644)
	s, err := LoadSigner(kp, "agent-h1")
	if err != nil || s.KeyID() != "agent-h1" {
		t.Fatalf("LoadSigner: %v", err)
	}
	if _, err := LoadSigner(kp, ""); err == nil {
		t.Error("signer without key id accepted")
	}
	ring, err := LoadKeyring(rp)
	if err != nil {
		t.Fatal(err)
	}
	r := Result{V: Version, CommandID: "c", Host: "h1", Status: Succeeded}
	_ = s.SignResult(&r)
	b, _ := json.Marshal(r)
	if k, err := ring.Verify(TypeResult, b, time.Now()); err != nil || k.Host != "h1" {
		t.Errorf("verify with loaded keys: %v", err)
	}
}

func TestSignBody(t *testing.T) {
	bridge, _, ring := testSigners(t)
	body, err := bridge.SignBody(TypeCommand, []byte(`{"v":1,"id":"x","sig":"old","extra":{"b":1,"a":[1.0,2]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ring.Verify(TypeCommand, body, issued); err != nil {
		t.Errorf("%s: %v", body, err)
	}
}

// FuzzVerify: verification never panics and Canonical is idempotent.
func FuzzVerify(f *testing.F) {
	for _, name := range []string{"command.json", "result.json", "report.json"} {
		if b, err := os.ReadFile(filepath.Join("testdata", "sign", name)); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"sig":"","key_id":""}`))
	f.Add([]byte(`{"a":"\u0000\ud800","b":[1e-7,1e21,-0]}`))
	_, _, ring := testSigners(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, typ := range []MessageType{TypeCommand, TypeResult, TypeReport} {
			if _, err := ring.Verify(typ, body, issued); err == nil && !bytes.Contains(body, []byte("sig")) {
				t.Fatalf("verified without a signature: %s", body)
			}
		}
		c1, err := Canonical(body)
		if err != nil {
			return
		}
		c2, err := Canonical(c1)
		if err != nil || !bytes.Equal(c1, c2) {
			t.Fatalf("not idempotent: %s → %s (%v)", c1, c2, err)
		}
	})
}
