package policy

import (
	"bytes"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/ext"
	"gopkg.in/yaml.v3"

	"github.com/vgpu-bridge/vgpu-bridge/placement/catalog"
)

// CEL variables a rule can read.
const (
	varEvent     = "event"
	varInstance  = "instance"
	varHost      = "host"
	varMetrics   = "metrics"
	varProject   = "project"
	varPreferred = "preferred"
	varNow       = "now"
)

var celVars = []string{varEvent, varInstance, varHost, varMetrics, varProject, varPreferred, varNow}

// newEnv builds the CEL environment rules compile in. larger and smaller
// ask step for the neighbouring profile.
func newEnv(step func(name string, dir int) string) (*cel.Env, error) {
	str, integer := cel.StringType, cel.IntType
	mk := func(k IntentKind) func(...ref.Val) ref.Val {
		return func(args ...ref.Val) ref.Val {
			in := Intent{Kind: k}
			for i, a := range args {
				switch v := a.Value().(type) {
				case string:
					switch {
					case k == IntentAttach || k == IntentResize || k == IntentRelease:
						in.Profile = v
					case k == IntentTune:
						in.Scheduler = v
					case k == IntentSetLimits && i == 0:
						in.CPUMax = v
					case k == IntentSetLimits:
						in.MemoryHigh = v
					default:
						in.Message = v
					}
				case int64:
					switch {
					case k == IntentAttach:
						in.Count = int(v)
					case k == IntentTune && i == 1:
						in.TimesliceUS = int(v)
					case k == IntentTune:
						in.ClocksMHz = int(v)
					}
				}
			}
			return intentVal{in}
		}
	}
	fn := func(name string, k IntentKind, sigs ...[]*cel.Type) cel.EnvOption {
		var opts []cel.FunctionOpt
		for _, sig := range sigs {
			id := "policy_" + name
			for _, t := range sig {
				id += "_" + t.String()
			}
			opts = append(opts, cel.Overload(id, sig, intentCELType, cel.FunctionBinding(mk(k))))
		}
		return cel.Function(name, opts...)
	}
	stepFn := func(dir int) func(ref.Val) ref.Val {
		return func(v ref.Val) ref.Val {
			s, _ := v.Value().(string)
			return types.String(step(s, dir))
		}
	}
	env, err := cel.NewEnv(
		ext.NativeTypes(reflect.TypeOf(Event{}), reflect.TypeOf(Instance{}), reflect.TypeOf(Host{}),
			reflect.TypeOf(Project{}), reflect.TypeOf(GPU{}), reflect.TypeOf(VGPU{}), reflect.TypeOf(TuneRequest{}),
			ext.ParseStructTags(true)),
		fastFields(reflect.TypeOf(Event{}), reflect.TypeOf(Instance{}), reflect.TypeOf(Host{}), reflect.TypeOf(Project{}),
			reflect.TypeOf(GPU{}), reflect.TypeOf(VGPU{}), reflect.TypeOf(TuneRequest{})),
		ext.Strings(),
		cel.Variable(varEvent, cel.ObjectType("policy.Event")),
		cel.Variable(varInstance, cel.ObjectType("policy.Instance")),
		cel.Variable(varHost, cel.ObjectType("policy.Host")),
		cel.Variable(varMetrics, cel.MapType(cel.StringType, cel.DoubleType)),
		cel.Variable(varProject, cel.ObjectType("policy.Project")),
		cel.Variable(varPreferred, cel.StringType),
		cel.Variable(varNow, cel.TimestampType),
		fn("attach", IntentAttach, []*cel.Type{str, integer}, []*cel.Type{str}),
		fn("release", IntentRelease, []*cel.Type{}, []*cel.Type{str}),
		fn("resize", IntentResize, []*cel.Type{str}),
		fn("move", IntentMove, []*cel.Type{}),
		fn("tune", IntentTune, []*cel.Type{str, integer, integer}, []*cel.Type{str, integer}),
		fn("set_limits", IntentSetLimits, []*cel.Type{str, str}),
		fn("notify", IntentNotify, []*cel.Type{str}),
		fn("reject", IntentReject, []*cel.Type{str}),
		cel.Function("larger", cel.Overload("larger_string", []*cel.Type{str}, str, cel.UnaryBinding(stepFn(+1)))),
		cel.Function("smaller", cel.Overload("smaller_string", []*cel.Type{str}, str, cel.UnaryBinding(stepFn(-1)))),
		cel.Function("framebuffer_mib", cel.Overload("framebuffer_mib_string", []*cel.Type{str}, integer, cel.UnaryBinding(func(v ref.Val) ref.Val {
			s, _ := v.Value().(string)
			pn, err := catalog.ParseName(s)
			if err != nil {
				return types.Int(0)
			}
			return types.Int(pn.FramebufferMiB)
		}))),
		cel.Function("series", cel.Overload("series_string", []*cel.Type{str}, str, cel.UnaryBinding(func(v ref.Val) ref.Val {
			s, _ := v.Value().(string)
			pn, err := catalog.ParseName(s)
			if err != nil {
				return types.String("")
			}
			return types.String(string(pn.Series))
		}))),
	)
	if err != nil {
		return nil, err
	}
	if _, iss := env.Compile("true"); iss != nil && iss.Err() != nil {
		return nil, iss.Err()
	}
	return env, nil
}

// neighbours computes, for every profile, the next larger and smaller one
// of the same GPU model, series and MIG-ness, by framebuffer.
func neighbours(list []catalog.Profile) map[string][2]string {
	out := make(map[string][2]string, len(list))
	for _, cur := range list {
		out[cur.Name] = [2]string{neighbour(list, cur, -1), neighbour(list, cur, +1)}
	}
	return out
}

// neighbour returns the next larger (dir > 0) or smaller profile of the same
// GPU model, series and MIG-ness, by framebuffer; "" when there is none.
func neighbour(list []catalog.Profile, cur catalog.Profile, dir int) string {
	best := catalog.Profile{}
	for _, p := range list {
		if p.GPU != cur.GPU || p.Series != cur.Series || (p.MIGSlices > 0) != (cur.MIGSlices > 0) {
			continue
		}
		if dir > 0 && p.FramebufferMiB > cur.FramebufferMiB && (best.Name == "" || p.FramebufferMiB < best.FramebufferMiB) {
			best = p
		}
		if dir < 0 && p.FramebufferMiB < cur.FramebufferMiB && (best.Name == "" || p.FramebufferMiB > best.FramebufferMiB) {
			best = p
		}
	}
	return best.Name
}

// rule is a compiled rule.
type rule struct {
	Name        string
	Description string
	On          []string
	Line, Col   int
	When        string
	when        cel.Program
	always      bool // when is the constant true
	then        []cel.Program
	thenText    []string
	For         time.Duration
	Cooldown    time.Duration
	Final       bool
	paths       []valuePath // what the explanation shows
}

// valuePath is a variable path a condition reads, with a program that reads it.
type valuePath struct {
	text string
	acc  *accessor   // fast path
	prg  cel.Program // when acc is nil
}

// compileRules compiles every rule, appending errors with positions.
func (w *walker) compileRules(env *cel.Env, src []byte, specs []ruleSpec, loadCooldown time.Duration) []*rule {
	var out []*rule
	for _, rs := range specs {
		r := &rule{Name: rs.Name, Description: rs.Description, On: rs.On, When: rs.When, For: rs.For, Cooldown: rs.Cooldown, Final: rs.Final, Line: rs.node.Line, Col: rs.node.Column}
		if !rs.cooldownSet && rs.For > 0 {
			r.Cooldown = loadCooldown
		}
		ok := true
		whenNode := rs.whenNode
		if whenNode == nil {
			whenNode = rs.node
		}
		if prg, a := w.compileExpr(env, src, rs.Name, "when", rs.When, whenNode, cel.BoolType); prg != nil {
			r.when = prg
			r.always = strings.TrimSpace(rs.When) == "true"
			r.paths = w.paths(env, a)
		} else {
			ok = false
		}
		for i, t := range rs.Then {
			prg, _ := w.compileExpr(env, src, rs.Name, "then", t, rs.thenNodes[i], intentCELType)
			if prg == nil {
				ok = false
				continue
			}
			r.then = append(r.then, prg)
			r.thenText = append(r.thenText, t)
		}
		if ok {
			out = append(out, r)
		}
	}
	return out
}

// compileExpr compiles one CEL expression of a rule. Errors are positioned
// in the file: the node's position plus the offset within the expression.
func (w *walker) compileExpr(env *cel.Env, src []byte, ruleName, what, text string, node *yaml.Node, want *cel.Type) (cel.Program, *cel.Ast) {
	a, iss := env.Compile(text)
	if iss != nil && iss.Err() != nil {
		for _, e := range iss.Errors() {
			line, col := exprPos(src, node, e.Location.Line(), e.Location.Column())
			w.errs = append(w.errs, Error{Line: line, Col: col, Rule: ruleName, Msg: what + ": " + firstLine(e.Message)})
		}
		return nil, nil
	}
	if !a.OutputType().IsExactType(want) {
		line, col := exprPos(src, node, 1, 0)
		hint := ""
		if want == intentCELType {
			hint = "; use attach(profile, count), release(), resize(profile), move(), tune(scheduler, timeslice_us, clocks_mhz), set_limits(cpu_max, memory_high), notify(message) or reject(reason)"
		}
		w.errs = append(w.errs, Error{Line: line, Col: col, Rule: ruleName, Msg: fmt.Sprintf("%s: expression has type %s, want %s%s", what, a.OutputType(), want, hint)})
		return nil, nil
	}
	prg, err := env.Program(a, cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		line, col := exprPos(src, node, 1, 0)
		w.errs = append(w.errs, Error{Line: line, Col: col, Rule: ruleName, Msg: what + ": " + err.Error()})
		return nil, nil
	}
	return prg, a
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// exprPos maps a position inside a CEL expression (line 1-based, column
// 0-based) to the file. Plain scalars start at the node; quoted ones one
// column later; block scalars on the next line, at their indentation.
func exprPos(src []byte, n *yaml.Node, line, col int) (int, int) {
	if n == nil {
		return 0, 0
	}
	if line < 1 {
		line = 1
	}
	switch n.Style {
	case yaml.LiteralStyle, yaml.FoldedStyle:
		l := n.Line + line
		return l, indentOf(src, l) + col + 1
	case yaml.DoubleQuotedStyle, yaml.SingleQuotedStyle:
		if line == 1 {
			return n.Line, n.Column + 1 + col
		}
	default:
		if line == 1 {
			return n.Line, n.Column + col
		}
	}
	l := n.Line + line - 1
	return l, indentOf(src, l) + col + 1
}

func indentOf(src []byte, line int) int {
	lines := bytes.Split(src, []byte("\n"))
	if line < 1 || line > len(lines) {
		return 0
	}
	s := lines[line-1]
	return len(s) - len(bytes.TrimLeft(s, " \t"))
}

// paths collects the variable paths an expression reads (metrics.gpu_util,
// event.workload, metrics["x"]), longest first, and compiles a reader for
// each.
func (w *walker) paths(env *cel.Env, a *cel.Ast) []valuePath {
	if a == nil {
		return nil
	}
	found := map[string]bool{}
	sels := map[string][]pathSel{}
	roots := map[string]string{}
	var text func(e ast.Expr) (string, string, []pathSel, bool)
	text = func(e ast.Expr) (string, string, []pathSel, bool) {
		switch e.Kind() {
		case ast.IdentKind:
			n := e.AsIdent()
			return n, n, nil, contains(celVars, n)
		case ast.SelectKind:
			s := e.AsSelect()
			if s.IsTestOnly() {
				return "", "", nil, false
			}
			base, root, ps, ok := text(s.Operand())
			return base + "." + s.FieldName(), root, append(ps[:len(ps):len(ps)], pathSel{name: s.FieldName()}), ok
		case ast.CallKind:
			c := e.AsCall()
			if c.FunctionName() == "_[_]" && len(c.Args()) == 2 && c.Args()[1].Kind() == ast.LiteralKind {
				base, root, ps, ok := text(c.Args()[0])
				lit := c.Args()[1].AsLiteral()
				switch v := lit.Value().(type) {
				case string:
					return base + "[" + strconv.Quote(v) + "]", root, append(ps[:len(ps):len(ps)], pathSel{name: v, isKey: true}), ok
				case int64:
					return base + "[" + strconv.FormatInt(v, 10) + "]", root, nil, ok
				}
			}
		}
		return "", "", nil, false
	}
	ast.PostOrderVisit(a.NativeRep().Expr(), ast.NewExprVisitor(func(e ast.Expr) {
		if t, root, ps, ok := text(e); ok && t != varNow {
			found[t] = true
			sels[t], roots[t] = ps, root
		}
	}))
	// Keep only the longest paths: metrics.gpu_util, not metrics too.
	var list []string
	for p := range found {
		longer := false
		for q := range found {
			if q != p && (strings.HasPrefix(q, p+".") || strings.HasPrefix(q, p+"[")) {
				longer = true
				break
			}
		}
		if !longer {
			list = append(list, p)
		}
	}
	sort.Strings(list)
	var out []valuePath
	for _, p := range list {
		if acc, ok := newAccessor(roots[p], sels[p]); ok && !(roots[p] == varMetrics && len(sels[p]) == 0) {
			out = append(out, valuePath{text: p, acc: acc})
			continue
		}
		pa, iss := env.Compile(p)
		if iss != nil && iss.Err() != nil {
			continue
		}
		prg, err := env.Program(pa)
		if err != nil {
			continue
		}
		out = append(out, valuePath{text: p, prg: prg})
	}
	return out
}
