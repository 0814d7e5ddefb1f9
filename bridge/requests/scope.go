package requests

import (
	"context"
	"fmt"
)

// InProject reports whether r is about an instance of project, as Nova's
// notifications recorded it in instances.project_id. A request without an
// instance, or about an instance the bridge has not heard of, belongs to
// no project: only callers that see every project see it.
func (s *Store) InProject(ctx context.Context, r Request, project string) (bool, error) {
	if r.InstanceUUID == nil {
		return false, nil
	}
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM instances WHERE uuid = $1 AND project_id = $2)`,
		*r.InstanceUUID, project).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("request %s: project of instance %s: %w", r.ID, r.InstanceUUID, err)
	}
	return ok, nil
}
