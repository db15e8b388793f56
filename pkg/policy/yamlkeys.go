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

var cfgDurationType = reflect.TypeFor[time.Duration]()

// cfgCheckKeys walks the YAML tree against the Go types it decodes into and
// reports the first unknown key with its full path and line, and the first
// value that is not a Go duration where one belongs. It follows yaml struct
// tags, so a section defined elsewhere in the package is checked the same
// way as long as its struct fields carry the keys it accepts.
func cfgCheckKeys(n *yaml.Node, t reflect.Type, path string) error {
	n = cfgDeref(n)
	if n == nil || n.Tag == "!!null" {
		return nil
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == cfgDurationType {
		if n.Kind != yaml.ScalarNode {
			return fmt.Errorf("%s: want a Go duration (like 1500ms, 15m, 6h) (line %d)", path, n.Line)
		}
		if _, err := time.ParseDuration(n.Value); err != nil {
			return fmt.Errorf("%s: %q is not a Go duration (like 1500ms, 15m, 6h) (line %d)", path, n.Value, n.Line)
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return fmt.Errorf("%s: want a mapping (line %d)", cfgPathOr(path), n.Line)
		}
		fields := map[string]reflect.Type{}
		cfgStructKeys(t, fields)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" { // merge key: its mapping holds keys of t
				if err := cfgCheckKeys(v, t, path); err != nil {
					return err
				}
				continue
			}
			ft, ok := fields[k.Value]
			if !ok {
				ft, ok = fields[cfgAnyKey]
			}
			if !ok {
				return fmt.Errorf("unknown key %q (line %d)", cfgJoin(path, k.Value), k.Line)
			}
			if err := cfgCheckKeys(v, ft, cfgJoin(path, k.Value)); err != nil {
				return err
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return fmt.Errorf("%s: want a mapping (line %d)", cfgPathOr(path), n.Line)
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if err := cfgCheckKeys(v, t.Elem(), cfgJoin(path, k.Value)); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			return nil // let the decoder report the type error
		}
		for i, e := range n.Content {
			if err := cfgCheckKeys(e, t.Elem(), path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
	}
	return nil
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
