package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "vgpu-agent ") {
		t.Fatalf("version = %d %q", code, out.String())
	}
}

func TestBadConfigurationExits2(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"serve", "--config", "", "--set", "DEFAULT.log_format=xml", "--set", "DEFAULT.shutdown_timeout=forever"}, &out, &errb)
	if code != 2 {
		t.Fatalf("exit %d, want 2; stderr %s", code, errb.String())
	}
	for _, want := range []string{`[DEFAULT] log_format = "xml": not one of the choices; allowed: json, text`, `[DEFAULT] shutdown_timeout = "forever": not a duration`} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
}
