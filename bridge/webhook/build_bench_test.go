package webhook

import (
	"testing"
	"time"
)

var benchBody = []byte(`{"type":"GPU_LOAD","vm_id":"8b1a3f50-0b7c-4f2e-9d0a-8f6a1b2c3d4e","workload":"training","metrics":{"util":0.93,"seq":12345}}`)

// BenchmarkDecodeNative is the decoding of the load harness's body.
func BenchmarkDecodeNative(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, bad := DecodeNative(benchBody, func(string) bool { return true }); len(bad) > 0 {
			b.Fatal(bad)
		}
	}
}

// BenchmarkBuild is a native request's pending commit (decode, payloads, answer).
func BenchmarkBuild(b *testing.B) {
	e := &Endpoint{answerHead: answerHead("https://bridge.example.org")}
	src := &source{cfg: Source{Name: "bench", Format: FormatNative}, label: "webhook:bench"}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if _, bad := e.build(src, benchBody, now); len(bad) > 0 {
			b.Fatal(bad)
		}
	}
}
