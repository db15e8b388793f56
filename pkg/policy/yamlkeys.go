package policy

// Checking a YAML document against the Go types it decodes into, so an
// unknown key or a number where a duration belongs is an error naming its
// path and line instead of a silently ignored setting.

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

func cfgDeref(n *yaml.Node) *yaml.Node {
	for n != nil {
		switch n.Kind {
		case yaml.DocumentNode:
			if len(n.Content) == 0 {
				return nil
			}
			n = n.Content[0]
		case yaml.AliasNode:
			n = n.Alias
		case 0: // empty input
			return nil
		default:
			return n
		}
	}
	return nil
}

var (
	cfgDurationType    = reflect.TypeFor[time.Duration]()
	cfgUnmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
)

// cfgCheckKeys walks the YAML tree against the Go types it decodes into and
// returns every problem, in document order, each naming its full key path
// and line: an unknown key, a value of the wrong type (a quoted "3" where a
// whole number belongs, a word where a list belongs), a value that is not a
// Go duration where one belongs. It removes each offending entry from the
// tree, so what is left still decodes and validates and the caller can
// report every problem at once. It follows yaml struct tags, so a section
// defined in another package is checked the same way as long as its
// struct fields carry the keys it accepts.
func cfgCheckKeys(n *yaml.Node, t reflect.Type, path string) []error {
	errs, _ := cfgCheck(n, t, path)
	return errs
}

// cfgCheck is cfgCheckKeys for one node; drop reports that the node itself
// cannot be decoded into t and its entry must go.
func cfgCheck(n *yaml.Node, t reflect.Type, path string) (errs []error, drop bool) {
	n = cfgDeref(n)
	if n == nil || n.Tag == "!!null" {
		return nil, false
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	bad := func(want string) ([]error, bool) {
		return []error{fmt.Errorf("%s: want %s, got %s (line %d)", cfgPathOr(path), want, cfgDescribe(n), n.Line)}, true
	}
	if t == cfgDurationType {
		if n.Kind != yaml.ScalarNode {
			return bad("a Go duration (like 1500ms, 15m, 6h)")
		}
		if _, err := time.ParseDuration(n.Value); err != nil {
			return []error{fmt.Errorf("%s: %q is not a Go duration (like 1500ms, 15m, 6h) (line %d)", path, n.Value, n.Line)}, true
		}
		return nil, false
	}
	if t.Kind() != reflect.Struct && reflect.PointerTo(t).Implements(cfgUnmarshalerType) {
		return nil, false // its own decoder judges it
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return bad("a mapping")
		}
		fields := map[string]reflect.Type{}
		cfgStructKeys(t, fields)
		keep := n.Content[:0:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" { // merge key: its mapping holds keys of t
				es, d := cfgCheck(v, t, path)
				errs = append(errs, es...)
				if !d {
					keep = append(keep, k, v)
				}
				continue
			}
			ft, ok := fields[k.Value]
			if !ok {
				ft, ok = fields[cfgAnyKey]
			}
			if !ok {
				errs = append(errs, fmt.Errorf("unknown key %q (line %d)", cfgJoin(path, k.Value), k.Line))
				continue
			}
			es, d := cfgCheck(v, ft, cfgJoin(path, k.Value))
			errs = append(errs, es...)
			if !d {
				keep = append(keep, k, v)
			}
		}
		n.Content = keep
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return bad("a mapping")
		}
		keep := n.Content[:0:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			es, d := cfgCheck(v, t.Elem(), cfgJoin(path, k.Value))
			errs = append(errs, es...)
			if !d {
				keep = append(keep, k, v)
			}
		}
		n.Content = keep
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			return bad("a list")
		}
		keep := n.Content[:0:0]
		for i, e := range n.Content {
			es, d := cfgCheck(e, t.Elem(), path+"["+strconv.Itoa(i)+"]")
			errs = append(errs, es...)
			if !d {
				keep = append(keep, e)
			}
		}
		n.Content = keep
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			return bad("a string")
		}
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
			return bad("true or false")
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
			return bad("a whole number")
		}
	case reflect.Float32, reflect.Float64:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" && n.ShortTag() != "!!float" {
			return bad("a number")
		}
	}
	return errs, false
}

// cfgDescribe says what a node holds, for an error: a scalar quoted as
// written (with a hint when quotes made a number a string), or its kind.
func cfgDescribe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0 {
		var probe yaml.Node
		if yaml.Unmarshal([]byte(n.Value), &probe) == nil {
			if v := cfgDeref(&probe); v != nil && (v.ShortTag() == "!!int" || v.ShortTag() == "!!float" || v.ShortTag() == "!!bool") {
				return fmt.Sprintf("the quoted string %q (drop the quotes)", n.Value)
			}
		}
	}
	return strconv.Quote(n.Value)
}

// cfgStructKeys collects the YAML keys of a struct as yaml.v3 sees them:
// the tag name, or the lower-cased field name, with inline structs
// flattened.
func cfgStructKeys(t reflect.Type, into map[string]reflect.Type) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch ft.Kind() {
			case reflect.Struct:
				cfgStructKeys(ft, into)
			case reflect.Map:
				into[cfgAnyKey] = ft.Elem()
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		into[name] = f.Type
	}
}

// cfgAnyKey stands for "any other key" of a struct with an inline map.
const cfgAnyKey = "\x00any"

func cfgJoin(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func cfgPathOr(path string) string {
	if path == "" {
		return "policy"
	}
	return path
}
