package daemon

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// Probe is where a running daemon answers its health: its listen address
// and, when it serves TLS, its own certificate file.
type Probe struct {
	Listen   string // host:port as configured; an unspecified host is probed on loopback
	CertFile string // PEM certificate the daemon serves; "" for plain HTTP
}

// probeURL is the URL of path on p's listener: a wildcard or empty host
// is this machine's loopback, where a container's own health command runs.
func (p Probe) probeURL(path string) (string, error) {
	host, port, err := net.SplitHostPort(p.Listen)
	if err != nil {
		return "", fmt.Errorf("listen address %q: %w", p.Listen, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	scheme := "http"
	if p.CertFile != "" {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port) + path, nil
}

// client trusts exactly the daemon's own certificate (pinned: compared
// byte for byte with the first certificate of CertFile), whatever name it
// carries, since the probe reaches it by a loopback address.
func (p Probe) client(timeout time.Duration) (*http.Client, error) {
	tr := &http.Transport{Proxy: nil, DisableKeepAlives: true}
	if p.CertFile != "" {
		leaf, err := firstCertificate(p.CertFile)
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = &tls.Config{
			MinVersion:         tls.VersionTLS12,
			InsecureSkipVerify: true, // the chain is not checked; VerifyPeerCertificate pins the leaf instead
			VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
				if len(raw) == 0 || !bytes.Equal(raw[0], leaf) {
					return errors.New("the server's certificate is not the configured tls_cert_file's")
				}
				return nil
			},
		}
	}
	return &http.Client{Transport: tr, Timeout: timeout}, nil
}

// firstCertificate is the DER of the first certificate of a PEM file.
func firstCertificate(path string) ([]byte, error) {
	rest, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tls_cert_file: %w", err)
	}
	for {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return nil, fmt.Errorf("tls_cert_file %s holds no PEM certificate", path)
		}
		if b.Type == "CERTIFICATE" {
			return b.Bytes, nil
		}
	}
}

func healthcheckCmd(g *Globals) *cobra.Command {
	var ready bool
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "healthcheck",
		Short: "Ask the running daemon whether it is healthy (a container's health command); exit 0 or 1",
		Long: "healthcheck reads the configuration as the daemon does and asks the daemon listening there " +
			"GET /healthz (the process serves), or /readyz with --ready (its database, broker and other " +
			"dependencies answer too). It prints the answer and exits 0 when it is 200, 1 otherwise: what " +
			"podman's and Docker's --health-cmd and kolla's healthchecks expect from an image with no shell or curl. " +
			"A wildcard listen address is asked on loopback; over TLS the daemon's own tls_cert_file is the " +
			"one certificate trusted.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.Spec.Probe == nil {
				return errors.New("this daemon has no health endpoint")
			}
			v, err := g.Load()
			if err != nil {
				return err
			}
			path := "/healthz"
			if ready {
				path = "/readyz"
			}
			return probe(cmd.Context(), g, g.Spec.Probe(v), path, timeout)
		},
	}
	c.Flags().BoolVar(&ready, "ready", false, "ask /readyz (dependencies too) rather than /healthz")
	c.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "how long the answer may take")
	return c
}

func probe(ctx context.Context, g *Globals, p Probe, path string, timeout time.Duration) error {
	u, err := p.probeURL(path)
	if err != nil {
		return err
	}
	client, err := p.client(timeout)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		fmt.Fprintf(g.Stderr, "%s: unhealthy: %v\n", g.Spec.Name, err)
		return ExitCode(ExitFailure)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	line := strings.Join(strings.Fields(string(body)), " ")
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(g.Stderr, "%s: unhealthy: %s %s: %s\n", g.Spec.Name, u, resp.Status, line)
		return ExitCode(ExitFailure)
	}
	fmt.Fprintf(g.Stdout, "%s: healthy: %s %s %s\n", g.Spec.Name, u, resp.Status, line)
	return nil
}
