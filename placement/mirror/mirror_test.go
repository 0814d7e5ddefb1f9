package mirror

import (
	"testing"

	"github.com/google/uuid"
)

// TestUUIDText: Records writes a uuid's text as Postgres and package
// uuid do.
func TestUUIDText(t *testing.T) {
	for _, s := range []string{"00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff",
		"0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9", uuid.NewString(), uuid.NewString()} {
		id := uuid.MustParse(s)
		if got := string(uuidText([]byte("x"), id)); got != "x"+s {
			t.Errorf("uuidText(%s) = %q", s, got)
		}
	}
}
