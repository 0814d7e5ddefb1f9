package webhook

import (
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

// options are the [webhooks] options of the endpoint and its callbacks,
// declared once with their defaults: the bridge's set takes them from
// Options, and DefaultConfig is built from them. The listener's options
// and the [webhook_source:NAME] sections are the bridge's.
var options = conf.NewGroup()

var (
	optPublicURL = options.String("webhooks", "public_url", "",
		"Scheme, host and port senders reach the bridge at; status_url in answers starts with it. Empty answers "+
			"a path (/v1/requests/ID). Example: https://vgpu-bridge.example.org:9443")
	optIdempotencyTTL = options.Duration("webhooks", "idempotency_ttl", 24*time.Hour, time.Minute, 30*24*time.Hour,
		"How long an Idempotency-Key (or webhook-id) is remembered per source. Example: 24h")
	optCommitBatchSize = options.Int("webhooks", "commit_batch_size", 256, 1, 10000,
		"Most webhooks committed in one transaction (group commit; each 202 still waits for its commit). Example: 256")
	optCommitWorkers = options.Int("webhooks", "commit_workers", 1, 1, 64,
		"Transactions committing webhooks at once (database connections used). One commits whatever queued during the previous commit, so batches grow with the load; more commit smaller batches side by side, at more CPU per request, which pays only where Postgres has cores and storage to spare. Example: 1")
	optCallbackTimeout = options.Duration("webhooks", "callback_timeout", 10*time.Second, time.Second, 5*time.Minute,
		"How long one callback POST may take. Example: 10s")
	optCallbackMaxAttempts = options.Int("webhooks", "callback_max_attempts", 12, 1, 1000,
		"Attempts before a callback is given up (each is recorded). Example: 12")
	optCallbackBackoffMin = options.Duration("webhooks", "callback_backoff_min", 5*time.Second, 100*time.Millisecond, time.Hour,
		"Wait after the first failed callback attempt; it doubles after each failure, with jitter. Example: 5s")
	optCallbackBackoffMax = options.Duration("webhooks", "callback_backoff_max", 10*time.Minute, time.Second, 24*time.Hour,
		"Longest wait between callback attempts. Example: 10m")
	optCallbackPollInterval = options.Duration("webhooks", "callback_poll_interval", time.Second, 10*time.Millisecond, time.Minute,
		"How often due callbacks are looked for. Example: 1s")
)

// Options returns the endpoint's [webhooks] options.
func Options() *conf.Group { return options }

// ConfigFrom maps the endpoint's [webhooks] options to a Config; the
// sources, CommitTimeout and the collaborators are the caller's, and
// setDefaults fills those left zero.
func ConfigFrom(v *conf.Values) Config {
	return Config{
		PublicURL:      optPublicURL.Get(v),
		IdempotencyTTL: optIdempotencyTTL.Get(v),
		BatchSize:      optCommitBatchSize.Get(v),
		CommitWorkers:  optCommitWorkers.Get(v),
		Callbacks: CallbackConfig{
			PollInterval: optCallbackPollInterval.Get(v),
			Timeout:      optCallbackTimeout.Get(v),
			MaxAttempts:  optCallbackMaxAttempts.Get(v),
			BackoffMin:   optCallbackBackoffMin.Get(v),
			BackoffMax:   optCallbackBackoffMax.Get(v),
		},
	}
}

// DefaultConfig returns the defaults of the endpoint's [webhooks] options,
// and of the fields no option sets: a commit timeout of 10s (two thirds
// of [webhooks] write_timeout's default), 10,000 clients' rate limiters
// per source, callback leases of 2m and 8 callbacks at once.
func DefaultConfig() Config {
	c := ConfigFrom(conf.Defaults(options))
	c.CommitTimeout = 10 * time.Second
	c.MaxClients = 10000
	c.Callbacks.Lease = 2 * time.Minute
	c.Callbacks.Parallel = 8
	return c
}
