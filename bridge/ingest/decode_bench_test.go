package ingest

import (
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
)

// BenchmarkDecodeDeliveries decodes deliveries of every Nova sample, as
// the consumer's committers do before a batch's commit.
func BenchmarkDecodeDeliveries(b *testing.B) {
	samples, err := novatest.Samples(filepath.Join("..", "..", novatest.SamplesDir))
	if err != nil {
		b.Fatal(err)
	}
	ds := make([]amqp.Delivery, len(samples))
	size := 0
	for i, s := range samples {
		ds[i] = amqp.Delivery{Body: s.Wire("bench-"+s.Name, time.Unix(1714564800, 0)), DeliveryTag: uint64(i + 1)}
		size += len(ds[i].Body)
	}
	c := &Consumer{cfg: DefaultConfig(), log: discard, m: newMetrics(nil, func() float64 { return 0 }, func() float64 { return 0 })}
	b.SetBytes(int64(size / len(ds)))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if it := c.decode(&ds[i%len(ds)]); it.ev == nil {
			b.Fatalf("dead letter: %s %s", it.reason, it.detail)
		}
		i++
	}
}
