package store

import (
	"reflect"
	"testing"
)

func TestWith(t *testing.T) {
	sql, args := With(Part{SQL: `SELECT $1::int + $2`, Args: []any{5, 6}},
		Part{SQL: `INSERT INTO a (x) VALUES ($1)`, Args: []any{1}},
		Part{SQL: `UPDATE b SET y = $2 WHERE id = $1 AND z = $10`, Args: []any{2, 3, 4, 5, 6, 7, 8, 9, 10, 11}})
	want := `WITH w1 AS (INSERT INTO a (x) VALUES ($1)), w2 AS (UPDATE b SET y = $3 WHERE id = $2 AND z = $11) SELECT $12::int + $13`
	if sql != want {
		t.Errorf("With: %s\nwant %s", sql, want)
	}
	if wantArgs := []any{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 5, 6}; !reflect.DeepEqual(args, wantArgs) {
		t.Errorf("With args: %v, want %v", args, wantArgs)
	}
	if sql, args := With(Part{SQL: `SELECT $1`, Args: []any{1}}); sql != `SELECT $1` || len(args) != 1 {
		t.Errorf("With of no part: %s %v", sql, args)
	}
}
