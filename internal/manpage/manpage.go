// SPDX-License-Identifier: Apache-2.0

// Package manpage writes a command tree's manual pages (roff) from its
// cobra definitions, so the pages say what --help says. Each binary has
// a hidden "man" subcommand; make deb ships what it writes.
package manpage

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/vgpu-bridge/vgpu-bridge/internal/version"
)

// Command is the hidden "man -o DIR" subcommand that writes one page per
// command of the tree it is added to (NAME.SECTION, NAME-SUB.SECTION, …).
// The pages' date is SOURCE_DATE_EPOCH when set, for reproducible
// packages.
func Command(section string) *cobra.Command {
	var dir string
	c := &cobra.Command{
		Use:    "man",
		Short:  "Write the manual pages of every command into a directory",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return Write(cmd.Root(), section, dir)
		},
	}
	c.Flags().StringVarP(&dir, "output", "o", ".", "directory to write the pages into")
	return c
}

// Write writes root's pages into dir.
func Write(root *cobra.Command, section, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root.DisableAutoGenTag = true
	h := &doc.GenManHeader{
		Section: section,
		Source:  "vgpu-bridge " + version.Version(),
		Manual:  "vgpu-bridge",
	}
	if err := doc.GenManTree(root, h, dir); err != nil {
		return fmt.Errorf("manual pages of %s: %w", root.Name(), err)
	}
	return nil
}
