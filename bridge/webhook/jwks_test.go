// SPDX-License-Identifier: Apache-2.0

package webhook

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// hangingJWKS serves a JWKS until hang is set; from then on each GET
// hangs until release is closed (or the client goes), counting how many
// hang at once.
type hangingJWKS struct {
	*httptest.Server
	body     []byte
	hang     atomic.Bool
	gets     atomic.Int64
	inflight atomic.Int64
	most     atomic.Int64
	release  chan struct{}
}

func newHangingJWKS(t *testing.T, body []byte) *hangingJWKS {
	s := &hangingJWKS{body: body, release: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.gets.Add(1)
		if !s.hang.Load() {
			w.Write(s.body)
			return
		}
		n := s.inflight.Add(1)
		defer s.inflight.Add(-1)
		for {
			m := s.most.Load()
			if n <= m || s.most.CompareAndSwap(m, n) {
				break
			}
		}
		select {
		case <-s.release:
			http.Error(w, "gave up", http.StatusBadGateway)
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() {
		s.unhang()
		s.Close()
	})
	return s
}

func (s *hangingJWKS) unhang() {
	select {
	case <-s.release:
	default:
		close(s.release)
	}
}

// TestJWKSHangingIssuer: while the JWKS url hangs, tokens naming a kid
// the keys lack share one fetch (never more than one in flight, never
// one after another), each waits only as long as its own context allows
// and is then answered 503 jwks_unavailable; tokens whose kid is in hand
// never wait; and a fetch that failed is not tried again at once.
func TestJWKSHangingIssuer(t *testing.T) {
	k := keys(t)
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	srv := newHangingJWKS(t, jwksOf(t, map[string]any{"a": k.ec}))
	v := testVerifier(t, Source{JWKSURL: srv.URL}, clk, nil)
	known := func() *authError {
		_, err := v.verify(context.Background(), mint(t, k.ec, jose.ES256, "a", claimsAt(clk.now())), clk.now())
		return err
	}
	wantReason(t, known(), "") // the first fetch
	srv.hang.Store(true)
	clk.add(time.Minute) // long past the least interval between fetches

	const callers = 200
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reasons := make(chan string, callers)
	var started sync.WaitGroup
	for i := range callers {
		started.Add(1)
		go func() {
			started.Done()
			tok := mint(t, k.edOther, jose.EdDSA, fmt.Sprintf("rotated-%d", i), claimsAt(clk.now()))
			_, err := v.verify(ctx, tok, clk.now())
			if err == nil {
				reasons <- "accepted"
				return
			}
			reasons <- err.reason
		}()
	}
	started.Wait()
	waitFor(t, func() bool { return srv.inflight.Load() == 1 })
	// Meanwhile a token whose key is in hand is answered at once.
	for range 20 {
		wantReason(t, known(), "")
	}
	// The callers' deadlines pass: every one is answered, with the
	// fetch still hanging.
	cancel()
	got := map[string]int{}
	timeout := time.After(30 * time.Second)
	for range callers {
		select {
		case r := <-reasons:
			got[r]++
		case <-timeout:
			t.Fatalf("callers still waiting after their context ended (answered: %v)", got)
		}
	}
	if srv.inflight.Load() != 1 {
		t.Error("the callers were answered only once the fetch ended, not when their context did")
	}
	if got["jwks_unavailable"] != callers {
		t.Errorf("answers %v, want %d jwks_unavailable", got, callers)
	}
	if m, n := srv.most.Load(), srv.gets.Load(); m != 1 || n != 2 {
		t.Errorf("%d fetches at most at once and %d in all, want 1 and 2 (the first, and the hanging one)", m, n)
	}
	// More unknown kids while it still hangs: they ask for no fetch.
	for i := range 50 {
		done, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := v.verify(done, mint(t, k.edOther, jose.EdDSA, fmt.Sprintf("late-%d", i), claimsAt(clk.now())), clk.now())
		wantReason(t, err, "jwks_unavailable")
	}
	// The fetch fails: the next unknown kid does not start another at
	// once (it is answered from what is known, without waiting).
	srv.unhang()
	waitFor(t, func() bool { return srv.inflight.Load() == 0 })
	waitFor(t, func() bool {
		_, err := v.verify(context.Background(), mint(t, k.edOther, jose.EdDSA, "after", claimsAt(clk.now())), clk.now())
		return err != nil && err.reason == "jwks_unavailable"
	})
	for i := range 50 {
		_, err := v.verify(context.Background(), mint(t, k.edOther, jose.EdDSA, fmt.Sprintf("again-%d", i), claimsAt(clk.now())), clk.now())
		wantReason(t, err, "jwks_unavailable")
	}
	if n := srv.gets.Load(); n != 2 {
		t.Errorf("%d fetches after the failed one, want none", n-2)
	}
	wantReason(t, known(), "")
}
