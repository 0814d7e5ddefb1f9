package main

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/keys"
)

func newKeysCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "keys",
		Short: "Issue the bridge's signing key and enroll compute hosts (signed commands, results and reports)",
		Args:  cobra.NoArgs,
	}
	c.AddCommand(newKeysInitCmd(g), newKeysEnrolCmd(g))
	return c
}

func newKeysInitCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "init",
		Short: "Create [security] signing_key_file (Ed25519, mode 0600) and an empty agent_keys_file",
		Long: "Creates the bridge's signing key at [security] signing_key_file with key id [security] key_id, and " +
			"[security] agent_keys_file if it does not exist, then prints the public key agents trust. It never " +
			"overwrites a key.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := g.Load()
			if err != nil {
				return err
			}
			kf := bridge.SecurityKeyFiles(v)
			pub, err := keys.Init{SigningKeyFile: kf.SigningKeyFile, KeyID: kf.KeyID, AgentKeysFile: kf.AgentKeysFile}.Run()
			if err != nil {
				return err
			}
			fmt.Fprintf(g.Stdout, "signing key %s (key id %s) created; agent keys file %s\n", kf.SigningKeyFile, kf.KeyID, kf.AgentKeysFile)
			fmt.Fprintf(g.Stdout, "public key (keys enrol HOST hands it to each host as bridge-keys.pem):\n%s", pub)
			return nil
		},
	}
}

func newKeysEnrolCmd(g *globals) *cobra.Command {
	var out, keyID, etcDir string
	var rotate bool
	var grace time.Duration
	c := &cobra.Command{
		Use:   "enrol HOST",
		Short: "Issue HOST's key pair and add its public key to [security] agent_keys_file, in one step",
		Long: "Generates an Ed25519 key pair for the agent of HOST (its [DEFAULT] host), adds the public key to " +
			"[security] agent_keys_file with \"Host: HOST\", and writes into --out what the host needs: agent.key, " +
			"bridge-keys.pem (the bridge's public key) and agent-security.conf (the agent's [security] section). " +
			"Copy them to the host's --etc-dir and restart or SIGHUP its agent. The bridge reads agent_keys_file " +
			"again when a message names a key it does not hold, so it needs no reload; other replicas need the " +
			"same file. A host that has a key needs --rotate: the old key stays trusted for --grace.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := g.Load()
			if err != nil {
				return err
			}
			kf := bridge.SecurityKeyFiles(v)
			if kf.SigningKeyFile == "" {
				return usageError{Err: fmt.Errorf("[security] signing_key_file is not set (vgpu-bridge keys init)")}
			}
			signer, err := protocol.LoadSigner(kf.SigningKeyFile, kf.KeyID)
			if err != nil {
				return fmt.Errorf("[security] signing_key_file: %w", err)
			}
			host := args[0]
			if out == "" {
				out = host + "-keys"
			}
			en, err := keys.Enrol{AgentKeysFile: kf.AgentKeysFile, Bridge: signer, Host: host, KeyID: keyID,
				Rotate: rotate, Grace: grace}.Run()
			if err != nil {
				return err
			}
			paths, err := en.WriteHostFiles(out, etcDir)
			if err != nil {
				return fmt.Errorf("key %s is enrolled, but its files were not all written (enrol again with --rotate): %w", en.KeyID, err)
			}
			fmt.Fprintf(g.Stdout, "host %s enrolled with key %s in %s\n", host, en.KeyID, kf.AgentKeysFile)
			for _, id := range en.Retired {
				fmt.Fprintf(g.Stdout, "former key %s stays trusted until %s\n", id, en.NotAfter.Format(time.RFC3339))
			}
			fmt.Fprintf(g.Stdout, "copy to %s:%s/ (agent.key mode 0600, owned by the agent's user):\n", host, etcDir)
			for _, p := range paths {
				fmt.Fprintf(g.Stdout, "  %s\n", p)
			}
			fmt.Fprintf(g.Stdout, "and merge %s into the agent's configuration\n", filepath.Join(out, "agent-security.conf"))
			return nil
		},
	}
	f := c.Flags()
	f.StringVarP(&out, "out", "o", "", "directory to write the host's files into (default HOST-keys; must not hold them yet)")
	f.StringVar(&keyID, "key-id", "", "the new key's id (default HOST-YYYYMMDD-random)")
	f.StringVar(&etcDir, "etc-dir", "/etc/vgpu-bridge", "where the files go on the host (named in agent-security.conf)")
	f.BoolVar(&rotate, "rotate", false, "HOST has a key: issue a new one and keep the old trusted for --grace")
	f.DurationVar(&grace, "grace", 24*time.Hour, "with --rotate, how long the former key stays trusted")
	return c
}
