// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"context"
	"fmt"
	"maps"

	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// ReservationConsumerType is the Placement consumer type of the bridge's
// reservation consumers: a consumer of the bridge's own (a fresh UUID the
// caller records) that holds vGPU units on a target host while the
// instance moves there. Nova hands every allocation of the instance's
// consumer to a migration consumer when a move starts, and fails the move
// when the instance's consumer is written meanwhile: the units the
// instance will need on the target wait in the reservation, and
// TransferReservation moves them into the instance's consumer once Nova
// is done.
const ReservationConsumerType = "VGPU_BRIDGE_RESERVATION"

// TransferReservation moves everything the reservation consumer holds
// into the instance consumer's allocations with one POST /allocations
// (Placement's multi-consumer write, atomic): the reservation is written
// with no allocations (which deletes it) and the instance is given its
// full set plus the reserved units, both guarded by their consumer
// generations. A generation conflict (Nova, or another writer, touched
// either consumer) is read again and retried with backoff until ctx ends.
//
// It returns what moved: provider → class → units. A reservation that
// holds nothing any more (moved already, or released) moves nothing and
// is no error, so a caller that crashed after the write can call it
// again. An instance consumer that does not exist (the instance is gone)
// is an error: the reservation stays, for the caller to release.
func (s *Service) TransferReservation(ctx context.Context, reservation, instance string) (map[string]map[string]int, error) {
	var b Backoff
	for {
		res, err := s.client.Allocations(ctx, reservation)
		if err != nil {
			return nil, fmt.Errorf("transfer reservation %s to %s: %w", reservation, instance, err)
		}
		if len(res.Providers) == 0 {
			return nil, nil
		}
		inst, err := s.client.Allocations(ctx, instance)
		if err != nil {
			return nil, fmt.Errorf("transfer reservation %s to %s: %w", reservation, instance, err)
		}
		if inst.Generation == nil || len(inst.Providers) == 0 {
			return nil, fmt.Errorf("transfer reservation %s to %s: %w: the instance's consumer has no allocations", reservation, instance, ErrConsumerGone)
		}
		moved := make(map[string]map[string]int, len(res.Providers))
		for rp, classes := range res.Providers {
			moved[rp] = maps.Clone(classes)
			sum := maps.Clone(inst.Providers[rp])
			if sum == nil {
				sum = map[string]int{}
			}
			for c, n := range classes {
				sum[c] += n
			}
			inst.Providers[rp] = sum
		}
		if inst.Type == "" {
			inst.Type = s.cfg.ConsumerType
		}
		if res.Type == "" {
			res.Type = ReservationConsumerType
		}
		emptied := &Consumer{UUID: reservation, Generation: res.Generation, ProjectID: res.ProjectID, UserID: res.UserID,
			Type: res.Type, Providers: map[string]map[string]int{}}
		err = s.client.PostAllocations(ctx, []*Consumer{emptied, inst})
		s.consumers.forget(instance)
		s.consumers.forget(reservation)
		if err == nil {
			for rp, classes := range moved {
				for c := range classes {
					s.learn(ctx, rp, instance, c, inst.Providers[rp][c])
				}
			}
			s.log.Info("placement: reservation moved into the instance's consumer", logkey.Consumer, instance, "reservation", reservation)
			return moved, nil
		}
		if !IsConflict(err) && !IsRetryable(err) {
			return nil, fmt.Errorf("transfer reservation %s to %s: %w", reservation, instance, err)
		}
		s.log.Debug("placement: reservation transfer: retry", logkey.Consumer, instance, "reservation", reservation, logkey.Err, err)
		if werr := b.Wait(ctx); werr != nil {
			return nil, fmt.Errorf("transfer reservation %s to %s: %w (gave up: %v)", reservation, instance, err, werr)
		}
	}
}
