package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
)

func webhookCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Act as a webhook source, to test one",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var secretFile, bodyFile, scheme, key, whURL string
	var watch bool
	var wf watchFlags
	send := &cobra.Command{
		Use:   "send SOURCE --secret-file F --body FILE",
		Short: "Sign a body as source SOURCE would and POST it to /v1/webhooks/SOURCE",
		Long: `Sign a body exactly as a [webhook_source:SOURCE] with auth = hmac expects
and POST it to /v1/webhooks/SOURCE; print the 202 answer.

  --scheme hub       X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>
                     with Idempotency-Key (the default)
  --scheme standard  Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature
  --scheme bearer    Authorization: Bearer <the secret file's text> (auth = bearer)

The secret file is read as the bridge reads secret_files (whsec_<base64> is the
decoded key). The idempotency key (or webhook-id) is random unless given:
resending with the same key and body answers the same request. With --watch
the request is followed with the operator credentials until it is final
(exit 5 if it failed or was rejected).

  vgpuctl webhook send batch --secret-file /etc/vgpu-bridge/secrets/batch \
      --body job.json --watch`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			secret, err := os.ReadFile(secretFile)
			if err != nil {
				return usageErr(fmt.Errorf("--secret-file: %w", err))
			}
			body, err := readInput(bodyFile)
			if err != nil {
				return usageErr(fmt.Errorf("--body: %w", err))
			}
			a := apiclient.WebhookAuth{Scheme: scheme, IdempotencyKey: key}
			switch scheme {
			case apiclient.SchemeHub, apiclient.SchemeStandard:
				if a.Key, err = apiclient.WebhookKey(string(secret)); err != nil {
					return usageErr(fmt.Errorf("--secret-file %s: %w", secretFile, err))
				}
			case apiclient.SchemeBearer:
				a.Key = []byte(strings.TrimSpace(string(secret)))
			default:
				return usageErr(fmt.Errorf("--scheme %q: use hub, standard or bearer", scheme))
			}
			wc := apiclient.New(apiclient.Config{URL: whURL, Timeout: g.timeout, UserAgent: "vgpuctl/" + version})
			if whURL == "" {
				wc = g.api()
			}
			ans, err := wc.SendWebhook(cmd.Context(), args[0], body, a)
			if err != nil {
				return err
			}
			if watch {
				if g.output == outTable {
					fmt.Fprintf(g.stderr, "%s request %s accepted\n", ts(time.Now()), ans.RequestID)
				}
				return g.watchAndShow(cmd.Context(), ans.RequestID, wf)
			}
			return g.emit(ans.Raw, func(w io.Writer) {
				kv(w, "Request ID", ans.RequestID, "Status URL", ans.StatusURL)
				for _, s := range ans.Skipped {
					kv(w, "Skipped", fmt.Sprintf("alert %d %s: %s", s.Index, s.AlertName, s.Reason))
				}
			})
		},
	}
	fl := send.Flags()
	fl.StringVar(&secretFile, "secret-file", "", "file holding the source's secret (or bearer token); required")
	fl.StringVar(&bodyFile, "body", "", `file holding the JSON body ("-": standard input); required`)
	fl.StringVar(&scheme, "scheme", apiclient.SchemeHub, "hub, standard or bearer")
	fl.StringVar(&key, "idempotency-key", "", "Idempotency-Key (hub, bearer) or webhook-id (standard); default random")
	fl.StringVar(&whURL, "webhook-url", os.Getenv("VGPUCTL_WEBHOOK_URL"), "base URL of the webhook listener when [webhooks] listen differs from the API's (env VGPUCTL_WEBHOOK_URL)")
	fl.BoolVarP(&watch, "watch", "w", false, "follow the request until it is final (needs operator credentials)")
	wf.add(send)
	send.MarkFlagRequired("secret-file")
	send.MarkFlagRequired("body")
	send.MarkFlagFilename("secret-file")
	send.MarkFlagFilename("body", "json")
	send.RegisterFlagCompletionFunc("scheme", cobra.FixedCompletions([]string{"hub", "standard", "bearer"}, cobra.ShellCompDirectiveNoFileComp))
	cmd.AddCommand(send)
	return cmd
}
