package policy

import (
	"strings"
	"testing"
)

func BenchmarkEvaluate100Rules(b *testing.B) {
	cat := testCatalog(b)
	p, err := Load(strings.NewReader(BenchPolicy(100)), Options{Catalog: cat, Compat: testCompat(b)})
	if err != nil {
		b.Fatal(err)
	}
	evs, st := BenchEvents(t0)
	tr := NewTracker()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.Evaluate(evs[i%len(evs)], st, tr)
	}
}

func BenchmarkEvaluateAndExplainText(b *testing.B) {
	p, err := Load(strings.NewReader(BenchPolicy(100)), Options{Catalog: testCatalog(b), Compat: testCompat(b)})
	if err != nil {
		b.Fatal(err)
	}
	evs, st := BenchEvents(t0)
	tr := NewTracker()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = p.Evaluate(evs[i%len(evs)], st, tr).Explain()
	}
}

func TestBenchPolicyLoads(t *testing.T) {
	p, err := Load(strings.NewReader(BenchPolicy(100)), Options{Catalog: testCatalog(t)})
	if err != nil {
		t.Fatal(err)
	}
	evs, st := BenchEvents(t0)
	fired := 0
	for _, ev := range evs {
		d := p.Evaluate(ev, st, NewTracker())
		for _, r := range d.Rules {
			if r.Outcome == OutcomeFired {
				fired++
			}
		}
	}
	if len(p.Rules()) != 100 || fired == 0 {
		t.Errorf("rules %d, fired %d", len(p.Rules()), fired)
	}
}
