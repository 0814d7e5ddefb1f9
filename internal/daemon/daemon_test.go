package daemon

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

var (
	testOptions = conf.NewGroup()
	testDebug   = testOptions.Bool(conf.DefaultSection, "debug", false, "Log at debug level.")
	testFormat  = testOptions.Choice(conf.DefaultSection, "log_format", "json", []string{"json", "text", "oslo_json"}, "Log format.")
	testLevels  = testOptions.List(conf.DefaultSection, "default_log_levels", "", "Component levels.")
)

func testSpec() Spec {
	set := func() *conf.Set { return conf.NewSet("DAEMON_TEST", testOptions) }
	return Spec{
		Name: "testd", Short: "a test daemon", Sample: "testd.conf.sample",
		Load:    func(src conf.Source) (*conf.Values, error) { return set().Load(src) },
		Options: set, SampleTitle: "testd sample", ReferenceTitle: "testd reference",
		Debug: testDebug.Get, LogFormat: testFormat.Get, LogLevels: testLevels.Get,
	}
}

// TestMainExitCodes: each kind of failure of a subcommand ends with its
// exit status, and the configuration is read with the flags' overrides.
func TestMainExitCodes(t *testing.T) {
	var debug bool
	cmd := func(g *Globals) *cobra.Command {
		return &cobra.Command{Use: "do", Args: cobra.MaximumNArgs(1), RunE: func(_ *cobra.Command, args []string) error {
			v, err := g.Load()
			if err != nil {
				return err
			}
			debug = testDebug.Get(v)
			switch strings.Join(args, "") {
			case "usage":
				return UsageError{errors.New("bad")}
			case "code":
				return ExitCode(7)
			case "fail":
				return errors.New("broken")
			}
			return nil
		}}
	}
	for _, tc := range []struct {
		args      []string
		rc        int
		debug     bool
		stderrHas string
	}{
		{[]string{"do", "--config", ""}, ExitOK, false, ""},
		{[]string{"do", "--config", "", "--debug"}, ExitOK, true, ""},
		{[]string{"do", "--config", "", "--set", "DEFAULT.debug=true"}, ExitOK, true, ""},
		{[]string{"do", "--config", "", "usage"}, ExitUsage, false, "testd: bad"},
		{[]string{"do", "--config", "", "code"}, 7, false, ""},
		{[]string{"do", "--config", "", "fail"}, ExitFailure, false, "testd: broken"},
		{[]string{"do", "--config", "", "--set", "DEFAULT.log_format=xml"}, ExitUsage, false, "bad configuration"},
		{[]string{"do", "--no-such-flag"}, ExitUsage, false, "unknown flag"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			debug = false
			var out, errb bytes.Buffer
			if rc := Main(testSpec(), tc.args, &out, &errb, cmd); rc != tc.rc {
				t.Fatalf("exit %d, want %d; stderr %q", rc, tc.rc, errb.String())
			}
			if debug != tc.debug {
				t.Errorf("debug %v, want %v", debug, tc.debug)
			}
			if !strings.Contains(errb.String(), tc.stderrHas) {
				t.Errorf("stderr %q lacks %q", errb.String(), tc.stderrHas)
			}
		})
	}
}

// TestSharedSubcommands: version and genconfig come with every daemon.
func TestSharedSubcommands(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := Main(testSpec(), []string{"genconfig", "--config", ""}, &out, &errb); rc != ExitOK {
		t.Fatalf("genconfig: exit %d: %s", rc, errb.String())
	}
	if !strings.Contains(out.String(), "testd sample") || !strings.Contains(out.String(), "log_format") {
		t.Errorf("genconfig wrote %q", out.String())
	}
	out.Reset()
	if rc := Main(testSpec(), []string{"version"}, &out, &errb); rc != ExitOK || !strings.Contains(out.String(), "testd") {
		t.Errorf("version: exit %d, %q", rc, out.String())
	}
}

// TestConfigCheck: config check lists every problem of a file, typos
// included, and exits 2; a good file exits 0.
func TestConfigCheck(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.conf", "[DEFAULT]\ndebug = true\n")
	bad := write("bad.conf", "[DEFAULT]\ndebg = true\nlog_format = xml\n[nosuch]\nx = 1\n")
	var out, errb bytes.Buffer
	if rc := Main(testSpec(), []string{"config", "check", "--config", good}, &out, &errb); rc != ExitOK ||
		!strings.Contains(out.String(), "configuration OK") {
		t.Errorf("good file: exit %d, %q %q", rc, out.String(), errb.String())
	}
	out.Reset()
	rc := Main(testSpec(), []string{"config", "check", "--config", bad}, &out, &errb)
	if rc != ExitUsage {
		t.Errorf("bad file: exit %d, want %d", rc, ExitUsage)
	}
	for _, want := range []string{"debg", "no such option", "log_format", "[nosuch]"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("bad file: stderr lacks %q:\n%s", want, errb.String())
		}
	}

	// Sections pasted from nova.conf pass, the options ignored listed as
	// the daemon would log them; a typo beside them still fails.
	nova := "[DEFAULT]\ndebug = true\nuse_stderr = false\n[keystone_authtoken]\nauth_type = password\nmemcached_servers = m:11211\n"
	out.Reset()
	errb.Reset()
	if rc := Main(testSpec(), []string{"config", "check", "--config", write("nova.conf", nova)}, &out, &errb); rc != ExitOK ||
		!strings.Contains(out.String(), "testd: warning: file ") ||
		!strings.Contains(out.String(), "[keystone_authtoken] auth_type, memcached_servers: ignored") ||
		!strings.Contains(out.String(), "[DEFAULT] use_stderr: ignored") {
		t.Errorf("nova.conf sections: exit %d, %q %q", rc, out.String(), errb.String())
	}
	errb.Reset()
	if rc := Main(testSpec(), []string{"config", "check", "--config", write("typo.conf", nova+"[DEFAULT]\nlog_fromat = text\n")}, &out, &errb); rc != ExitUsage ||
		!strings.Contains(errb.String(), "log_fromat") {
		t.Errorf("typo beside nova.conf sections: exit %d, %q", rc, errb.String())
	}
}
