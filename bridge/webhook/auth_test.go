package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/clock"
)

// The reference vector of the Standard Webhooks specification (its test
// suites and Svix's TestWebhookSign use it).
const (
	refSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	refID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	refTimestamp = "1614265330"
	refPayload   = `{"test": 2432232314}`
	refSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func refSource(t *testing.T) *source {
	t.Helper()
	k, err := SecretKey(refSecret)
	if err != nil {
		t.Fatal(err)
	}
	s := Source{Name: "ref", Auth: AuthHMAC, Secrets: [][]byte{k}, Rate: 1, Burst: 1}
	if err := checkSource(&s); err != nil {
		t.Fatal(err)
	}
	return &source{cfg: s}
}

func TestStandardWebhooksReferenceVector(t *testing.T) {
	k, _ := SecretKey(refSecret)
	if got := StandardSignature(refID, refTimestamp, []byte(refPayload), k); got != refSignature {
		t.Fatalf("StandardSignature = %s, want %s", got, refSignature)
	}
	s := refSource(t)
	at := time.Unix(1614265330, 0)
	h := http.Header{}
	h.Set(HeaderWebhookID, refID)
	h.Set(HeaderWebhookTimestamp, refTimestamp)
	h.Set(HeaderWebhookSignature, refSignature)
	for _, c := range []struct {
		name string
		now  time.Time
		body string
		sig  string
		want string // "" accepted, else the reason
	}{
		{"exact", at, refPayload, refSignature, ""},
		{"with another version and a second signature", at, refPayload, "v1a,xyz v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA= " + refSignature, ""},
		{"4m59s later", at.Add(4*time.Minute + 59*time.Second), refPayload, refSignature, ""},
		{"5m1s later", at.Add(5*time.Minute + time.Second), refPayload, refSignature, "timestamp_skew"},
		{"5m1s earlier", at.Add(-5*time.Minute - time.Second), refPayload, refSignature, "timestamp_skew"},
		// Past what a time.Duration holds (about 292 years): compared as
		// times, never as a difference that overflows.
		{"300 years ahead of the server", at.AddDate(-300, 0, 0), refPayload, refSignature, "timestamp_skew"},
		{"300 years behind the server", at.AddDate(300, 0, 0), refPayload, refSignature, "timestamp_skew"},
		{"body changed", at, `{"test": 2432232315}`, refSignature, "bad_signature"},
		{"only v1a", at, refPayload, "v1a,abc", "bad_signature"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h.Set(HeaderWebhookSignature, c.sig)
			key, _, err := s.verifyHMAC(h, []byte(c.body), c.now)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want == "" && key != refID:
				t.Errorf("replay key %q, want the webhook-id", key)
			case c.want != "" && (err == nil || err.reason != c.want):
				t.Errorf("got %v, want %s", err, c.want)
			}
		})
	}
}

// TestHubSignatureVector checks X-Hub-Signature-256 against a value
// computed here with crypto/hmac directly, and against a fixed vector.
func TestHubSignatureVector(t *testing.T) {
	key, body := []byte("It's a Secret to Everybody"), []byte("Hello, World!")
	m := hmac.New(sha256.New, key)
	m.Write(body)
	want := "sha256=" + hex.EncodeToString(m.Sum(nil))
	if got := HubSignature(key, body); got != want {
		t.Fatalf("HubSignature = %s, want %s", got, want)
	}
	// GitHub's documented example ("Validating webhook deliveries") for
	// this secret and payload.
	const github = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	if want != github {
		t.Errorf("HMAC of the documented example = %s, want %s", want, github)
	}
	s := &source{cfg: Source{Auth: AuthHMAC, Secrets: [][]byte{[]byte("other-secret-0123456789"), key}}}
	h := http.Header{}
	h.Set(HeaderHubSignature, github)
	// Without a key the body itself is the replay guard (bodyOnly).
	if k, bodyOnly, err := s.verifyHMAC(h, body, time.Now()); err != nil || k != "" || !bodyOnly {
		t.Errorf("without a key: %q %v %v", k, bodyOnly, err)
	}
	h.Set(HeaderGitHubDelivery, "72d3162e-cc78-11e3-81ab-4c9367dc0958")
	if k, _, err := s.verifyHMAC(h, body, time.Now()); err != nil || k != "72d3162e-cc78-11e3-81ab-4c9367dc0958" {
		t.Errorf("GitHub's delivery id as the key: %q %v", k, err)
	}
	h.Set(HeaderIdempotencyKey, "k")
	if k, _, err := s.verifyHMAC(h, body, time.Now()); err != nil || k != "k" {
		t.Errorf("second secret of a rotation, Idempotency-Key first: %q %v", k, err)
	}
	h.Set(HeaderHubSignature, strings.ToUpper(github[:7])+github[7:])
	if _, _, err := s.verifyHMAC(h, body, time.Now()); err == nil {
		t.Error("SHA256= prefix accepted")
	}
}

func TestSecretKey(t *testing.T) {
	if k, err := SecretKey(refSecret); err != nil || len(k) != 24 {
		t.Errorf("whsec_ key = %d bytes, %v", len(k), err)
	}
	for _, bad := range []string{"short", "whsec_!!!", "whsec_AAAA"} {
		if _, err := SecretKey(bad); err == nil {
			t.Errorf("SecretKey(%q) accepted", bad)
		}
	}
}

func TestParsers(t *testing.T) {
	for _, c := range []struct {
		h  string
		ok bool
	}{
		{"sha256=" + strings.Repeat("ab", 32), true},
		{"sha256=" + strings.Repeat("AB", 32), true},
		{"sha256=" + strings.Repeat("ab", 31), false},
		{"sha1=" + strings.Repeat("ab", 20), false},
		{"sha256=" + strings.Repeat("zz", 32), false},
		{"", false},
	} {
		if _, err := ParseHubSignature(c.h); (err == nil) != c.ok {
			t.Errorf("ParseHubSignature(%q) = %v", c.h, err)
		}
	}
	for _, c := range []struct {
		h string
		n int
	}{
		{refSignature, 1},
		{refSignature + " " + refSignature, 2},
		{"v1a,abc " + refSignature, 1},
		{"v1a,abc", 0},
		{"v1,abc", 0},
		{"garbage", 0},
		{"", 0},
	} {
		sigs, err := ParseStandardSignatures(c.h)
		if len(sigs) != c.n || (c.n == 0) != (err != nil) {
			t.Errorf("ParseStandardSignatures(%q) = %d, %v", c.h, len(sigs), err)
		}
	}
	for _, c := range []struct {
		s  string
		ok bool
	}{{"1614265330", true}, {"-1", false}, {"1e9", false}, {"", false}, {"99999999999999", false}, {" 1", false}} {
		if _, err := ParseTimestamp(c.s); (err == nil) != c.ok {
			t.Errorf("ParseTimestamp(%q) = %v", c.s, err)
		}
	}
}

func FuzzParseHubSignature(f *testing.F) {
	f.Add("sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")
	f.Add("sha256=")
	f.Add("sha1=abc")
	f.Fuzz(func(t *testing.T, h string) {
		mac, err := ParseHubSignature(h)
		if err == nil && len(mac) != sha256.Size {
			t.Fatalf("accepted a MAC of %d bytes", len(mac))
		}
	})
}

func FuzzParseStandardSignatures(f *testing.F) {
	f.Add(refSignature)
	f.Add("v1a,abc " + refSignature)
	f.Add("v1,")
	f.Add(" , ,v1")
	f.Fuzz(func(t *testing.T, h string) {
		sigs, err := ParseStandardSignatures(h)
		if err == nil && len(sigs) == 0 {
			t.Fatal("no error and no signature")
		}
		for _, s := range sigs {
			if len(s) != sha256.Size {
				t.Fatalf("accepted a signature of %d bytes", len(s))
			}
		}
		// The verifier never panics on what the parser lets through.
		s := &source{cfg: Source{Auth: AuthHMAC, Secrets: [][]byte{[]byte("0123456789abcdef")}, TimestampTolerance: time.Minute}}
		hd := http.Header{}
		hd.Set(HeaderWebhookID, "id")
		hd.Set(HeaderWebhookTimestamp, "1614265330")
		hd.Set(HeaderWebhookSignature, h)
		s.verifyHMAC(hd, nil, time.Unix(1614265330, 0))
	})
}

func FuzzParseTimestamp(f *testing.F) {
	f.Add("1614265330")
	f.Add("-5")
	f.Add("999999999999")
	f.Add("11060000000")
	now := time.Unix(1614265330, 0)
	const tol = 5 * 60
	f.Fuzz(func(t *testing.T, s string) {
		ts, err := ParseTimestamp(s)
		if err != nil {
			return
		}
		if ts.Unix() < 0 {
			t.Fatalf("negative time from %q", s)
		}
		// The skew check agrees with whole seconds compared as integers
		// (at most 12 digits: no overflow), however far the time is.
		d := ts.Unix() - now.Unix()
		if want := d >= -tol && d <= tol; clock.Within(ts, now, tol*time.Second) != want {
			t.Fatalf("%q (%d s from now): Within = %v, want %v", s, d, !want, want)
		}
	})
}

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, c := range []struct {
		remote string
		xff    []string
		want   string
	}{
		{"192.0.2.1:5000", []string{"198.51.100.7"}, "192.0.2.1"}, // untrusted peer: XFF ignored
		{"10.0.0.5:5000", []string{"198.51.100.7"}, "198.51.100.7"},
		{"10.0.0.5:5000", []string{"203.0.113.1, 198.51.100.7, 10.0.0.9"}, "198.51.100.7"},
		{"10.0.0.5:5000", []string{"203.0.113.1", "198.51.100.7"}, "198.51.100.7"},
		{"10.0.0.5:5000", []string{"garbage, 10.0.0.9"}, "10.0.0.9"},
		{"10.0.0.5:5000", nil, "10.0.0.5"},
		{"[::ffff:192.0.2.1]:5000", nil, "192.0.2.1"},
	} {
		got, ok := clientIP(c.remote, c.xff, trusted)
		if !ok || got.String() != c.want {
			t.Errorf("clientIP(%s, %v) = %v, want %s", c.remote, c.xff, got, c.want)
		}
	}
}

func TestLimiters(t *testing.T) {
	l := newLimiters(1, 2, 1, 1, 4)
	now := time.Unix(1000, 0)
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	allow := func(c netip.Addr) (string, time.Duration) {
		if r, d := l.allowClient(c, now); r != "" {
			return r, d
		}
		return l.allowSource(now)
	}
	if r, _ := allow(a); r != "" {
		t.Fatal(r)
	}
	if r, d := allow(a); r != "rate_limited_client" || d <= 0 {
		t.Fatalf("second from a: %s %v", r, d)
	}
	if r, _ := allow(b); r != "" {
		t.Fatal("b refused: the client refusal took a source token")
	}
	if r, _ := allow(netip.MustParseAddr("192.0.2.3")); r != "rate_limited_source" {
		t.Fatalf("third client: %s", r)
	}
	for i := range 100 {
		l.client(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), now.Add(time.Duration(i)*time.Second))
	}
	if len(l.clients) > 4 {
		t.Errorf("%d client limiters kept, bound 4", len(l.clients))
	}
	if retryAfter(1500*time.Millisecond) != 2 || retryAfter(0) != 1 {
		t.Error("retryAfter")
	}
}

// TestOperatorSourceNameReserved: "api" is the source of POST
// /v1/requests; a webhook source may not take it.
func TestOperatorSourceNameReserved(t *testing.T) {
	s := Source{Name: OperatorSource, Auth: AuthBearer, Tokens: []string{"a-token-long-enough-0123456789"}}
	if err := checkSource(&s); err == nil || !strings.Contains(err.Error(), "POST /v1/requests") {
		t.Fatalf("a source named %q: %v", OperatorSource, err)
	}
}
