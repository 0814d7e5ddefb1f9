// Package computeapi is the bridge's client of Nova's compute API, over
// gophercloud v2: the calls of the Nova-native path and nothing more.
//
//	c, err := computeapi.New(ctx, computeapi.Config{Endpoint: "http://127.0.0.1:8774/v2.1", Token: "admin:admin"})
//	srv, err := c.Server(ctx, "9ab1…", "req-5c1d…")     // flavor, host, status, task state
//	all, err := c.Flavors(ctx, "req-5c1d…")             // every flavor with its extra specs
//	err = c.Resize(ctx, srv.ID, "vgpu-t4-4q.m1", "req-5c1d…")
//	err = c.ConfirmResize(ctx, srv.ID, "req-5c1d…")     // or RevertResize
//
// Every call sends the given request id as X-OpenStack-Request-ID, which
// Nova takes as the global request id of its context: it comes back in the
// notifications the call causes. Errors are *Error; callers classify them
// with IsRetryable, IsConflict and IsNotFound.
package computeapi
