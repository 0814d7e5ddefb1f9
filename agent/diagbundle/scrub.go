// SPDX-License-Identifier: Apache-2.0

package diagbundle

import (
	"regexp"
	"strings"
)

// Masked replaces a secret value.
const Masked = "***"

// urlPassword matches the password of a URL's userinfo
// (rabbit://user:PASSWORD@host, postgres://u:PASSWORD@h).
var urlPassword = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*):([^@\s]*)@`)

// secretName matches option names whose values are secrets by name; an
// option ending in _file, _path or _dir names a file and its path is kept.
var secretName = regexp.MustCompile(`(?i)(password|passwd|secret|token|private_key|credential)`)

// ScrubText masks the passwords of URLs in s.
func ScrubText(s string) string {
	return urlPassword.ReplaceAllString(s, "${1}:"+Masked+"@")
}

// ScrubConfig masks secrets in configuration dump lines of the form
// "[section] name = value (source)" (conf.Values.Dump, which already
// masks the options declared secret): values of options named like a
// secret, unless the name ends in _file, _path or _dir (a path is printed,
// never the file's content), and URL passwords in any value.
func ScrubConfig(lines []string) []string {
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		out = append(out, scrubLine(l))
	}
	return out
}

func scrubLine(l string) string {
	l = ScrubText(l)
	_, rest, ok := strings.Cut(l, "] ")
	if !ok {
		return l
	}
	name, val, ok := strings.Cut(rest, " = ")
	if !ok || !secretName.MatchString(name) || isPathName(name) {
		return l
	}
	src := ""
	if i := strings.LastIndex(val, " ("); i >= 0 && strings.HasSuffix(val, ")") {
		val, src = val[:i], val[i:]
	}
	if val == "" || val == Masked {
		return l
	}
	return l[:len(l)-len(rest)] + name + " = " + Masked + src
}

func isPathName(name string) bool {
	for _, s := range []string{"_file", "_path", "_dir"} {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}
