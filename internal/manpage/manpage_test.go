// SPDX-License-Identifier: Apache-2.0

package manpage

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func tree() *cobra.Command {
	root := &cobra.Command{Use: "vgpu-demo", Short: "A demo daemon", Long: "Runs the demo.",
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true}}
	serve := &cobra.Command{Use: "serve", Short: "Serve until SIGTERM", RunE: func(*cobra.Command, []string) error { return nil }}
	serve.Flags().String("config", "/etc/demo.conf", "configuration file")
	root.AddCommand(serve, Command("8"))
	return root
}

func TestManPages(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	root := tree()
	root.SetArgs([]string{"man", "-o", dir})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	// One page per visible command; the hidden "man" has none.
	if want := []string{"vgpu-demo-serve.8", "vgpu-demo.8"}; !slices.Equal(names, want) {
		t.Fatalf("pages %q, want %q", names, want)
	}
	b, err := os.ReadFile(filepath.Join(dir, "vgpu-demo-serve.8"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, want := range []string{`.TH "VGPU-DEMO-SERVE" "8" "Nov 2023" "vgpu-bridge `, "Serve until SIGTERM", `\fB--config\fP="/etc/demo.conf"`, "configuration file"} {
		if !strings.Contains(page, want) {
			t.Errorf("vgpu-demo-serve.8 lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, "Auto generated") {
		t.Error("page carries cobra's generation tag (a date that differs between builds)")
	}
	// The same input gives the same bytes.
	again := t.TempDir()
	if err := Write(tree(), "8", again); err != nil {
		t.Fatal(err)
	}
	b2, _ := os.ReadFile(filepath.Join(again, "vgpu-demo-serve.8"))
	if string(b2) != page {
		t.Error("two runs wrote different pages")
	}
}
