package conf

import (
	"fmt"
	"sort"
	"strings"
)

// A configuration names only options that exist: a misspelt option,
// section or environment variable stops the program with the other
// errors (a default silently used in its place is worse), and the error
// names the nearest valid one. Options that were renamed or removed stay
// accepted, with a warning, for one release: Deprecated lists them beside
// the declarations.

// Deprecated records that [section] name was renamed to [newSection]
// newName (newName "" when it was removed). Loading a configuration that
// sets it warns; a renamed option's value goes to the new one unless that
// is set too.
func (s *Set) Deprecated(section, name, newSection, newName string) {
	to := ""
	if newName != "" {
		to = newSection + "." + newName
		if s.opts[to] == nil {
			panic(fmt.Sprintf("conf: [%s] %s renamed to an undeclared option [%s] %s", section, name, newSection, newName))
		}
	}
	s.renamed[section+"."+name] = to
}

// deprecated warns about the old option key, set in where, and returns the
// option that takes its value (nil when it was removed).
func (s *Set) deprecated(v *Values, old, where string) *Option {
	to := s.renamed[old]
	sec, name, _ := strings.Cut(old, ".")
	if to == "" {
		v.Warnings = append(v.Warnings, fmt.Sprintf("%s: [%s] %s was removed and is ignored; remove it", where, sec, name))
		return nil
	}
	o := s.opts[to]
	v.Warnings = append(v.Warnings, fmt.Sprintf("%s: [%s] %s is deprecated; use [%s] %s (the old name goes in the next release)", where, sec, name, o.Section, o.Name))
	// Within one layer (file, environment, flags) the new name wins; a
	// later layer overrides an earlier one whichever name each uses.
	layer := func(src string) string { l, _, _ := strings.Cut(src, " "); return l }
	if src := v.source[to]; layer(src) == layer(where) && !v.viaOld[to] {
		return nil
	}
	if v.viaOld == nil {
		v.viaOld = map[string]bool{}
	}
	v.viaOld[to] = true
	return o
}

func (s *Set) envRenamed(rest string) string {
	for old := range s.renamed {
		sec, name, _ := strings.Cut(old, ".")
		if strings.EqualFold(envName(sec, name), rest) {
			return old
		}
	}
	return ""
}

func (s *Set) hasSection(name string) bool {
	for _, o := range s.opts {
		if o.Section == name {
			return true
		}
	}
	return false
}

// nearestOption suggests the closest option of section, or of any section
// when the name belongs elsewhere.
func (s *Set) nearestOption(section, name string) string {
	var same []string
	for _, o := range s.opts {
		if o.Section == section {
			same = append(same, o.Name)
		}
	}
	if n, ok := nearest(name, same); ok {
		return fmt.Sprintf("; did you mean %s?", n)
	}
	for _, o := range s.opts {
		if o.Name == name {
			return fmt.Sprintf("; it is an option of [%s]", o.Section)
		}
	}
	return ""
}

func (s *Set) nearestSection(name string) string {
	seen := map[string]bool{}
	var names []string
	for _, o := range s.opts {
		if !seen[o.Section] {
			seen[o.Section] = true
			names = append(names, o.Section)
		}
	}
	for p := range s.templates {
		names = append(names, p+":NAME")
	}
	if n, ok := nearest(name, names); ok {
		return fmt.Sprintf("; did you mean [%s]?", n)
	}
	return ""
}

func (s *Set) nearestEnv(rest string) string {
	var names []string
	for _, o := range s.opts {
		names = append(names, s.EnvVar(o))
	}
	if n, ok := nearest(s.envPrefix+"_"+strings.ToUpper(rest), names); ok {
		return fmt.Sprintf("; did you mean %s?", n)
	}
	return ""
}

// nearest returns the candidate closest to name by edit distance, when it
// is close enough to be a likely misspelling (at most a third of the
// name's length, and at least 1, away).
func nearest(name string, candidates []string) (string, bool) {
	sort.Strings(candidates)
	best, bestD := "", len(name)/3+1
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(name), strings.ToLower(c)); d < bestD {
			best, bestD = c, d
		}
	}
	return best, best != ""
}

// editDistance is Levenshtein's distance between a and b.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
