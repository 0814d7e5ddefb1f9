package nova_test

import (
	"testing"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/nova/novatest"
)

// BenchmarkDecode decodes a real-shaped instance.create.end wire message:
// envelope, inner message and typed payload.
func BenchmarkDecode(b *testing.B) {
	samples, err := novatest.Samples(samplesDir)
	if err != nil {
		b.Fatal(err)
	}
	var body []byte
	for _, s := range samples {
		if s.Name == "instance-create-end" {
			body = s.Wire("bench", time.Unix(1714564800, 0))
		}
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		m, err := nova.Decode(body)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := m.Decode(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseExtraSpecs(b *testing.B) {
	specs := map[string]string{"resources1:VGPU": "1", "trait1:CUSTOM_NVIDIA_232": "required", "group_policy": "isolate", "hw:cpu_policy": "dedicated"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := nova.ParseExtraSpecs(specs); err != nil {
			b.Fatal(err)
		}
	}
}
