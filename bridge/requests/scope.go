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
	return s.InProjects(ctx, r, []string{project})
}

// InProjects reports whether r is about an instance of one of projects
// (InProject); none when projects is empty.
func (s *Store) InProjects(ctx context.Context, r Request, projects []string) (bool, error) {
	if r.InstanceUUID == nil || len(projects) == 0 {
		return false, nil
	}
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM instances WHERE uuid = $1 AND project_id = ANY($2::text[]))`,
		*r.InstanceUUID, projects).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("request %s: project of instance %s: %w", r.ID, r.InstanceUUID, err)
	}
	return ok, nil
}
