// Package apisurface lists a Go package's exported API, one declaration a
// line, from its source: what an importer can name. The repository keeps
// the list of its public packages in api/exported.txt, and a test compares
// it with the code, so every change to the public API is a visible diff.
package apisurface

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Dir lists the exported API of the package in dir (its non-test .go
// files), each line prefixed with name: funcs and methods with their
// signatures, types, constants and variables, and the exported fields and
// interface methods of exported types. An alias of a type in another
// package of the same module (type RetryConfig = retry.Config) lists that
// type's fields and methods under the alias's name: they are the alias's
// API, even when the package that declares them is internal.
func Dir(dir, name string) ([]string, error) {
	files, err := parseDir(token.NewFileSet(), dir)
	if err != nil {
		return nil, err
	}
	mod, err := findModule(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range files {
		for _, d := range f.file.Decls {
			out = append(out, decl(f.fset, name, d)...)
			out = append(out, aliased(mod, f, name, d)...)
		}
	}
	sort.Strings(out)
	return out, nil
}

// parsed is one parsed source file.
type parsed struct {
	fset *token.FileSet
	file *ast.File
}

// parseDir parses the package's non-test .go files in dir.
func parseDir(fset *token.FileSet, dir string) ([]parsed, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []parsed
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		if strings.HasSuffix(f.Name.Name, "_test") || f.Name.Name == "main" {
			continue
		}
		out = append(out, parsed{fset: fset, file: f})
	}
	return out, nil
}

// module is the Go module a directory is in.
type module struct {
	path string // its module path
	root string // the directory of its go.mod
}

// findModule walks up from dir to the nearest go.mod.
func findModule(dir string) (module, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return module{}, err
	}
	for d := abs; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if p, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
					return module{path: strings.Trim(strings.TrimSpace(p), `"`), root: d}, nil
				}
			}
			return module{}, fmt.Errorf("apisurface: %s/go.mod names no module", d)
		}
		if filepath.Dir(d) == d {
			return module{}, fmt.Errorf("apisurface: no go.mod above %s", abs)
		}
	}
}

// aliased lists, for each exported alias in d of a type declared in
// another package of mod, that type's exported fields, interface methods
// and methods, named by the alias.
func aliased(mod module, f parsed, pkg string, d ast.Decl) []string {
	g, ok := d.(*ast.GenDecl)
	if !ok || g.Tok != token.TYPE {
		return nil
	}
	var out []string
	for _, s := range g.Specs {
		ts, ok := s.(*ast.TypeSpec)
		if !ok || !ts.Assign.IsValid() || !ts.Name.IsExported() {
			continue
		}
		sel, ok := ts.Type.(*ast.SelectorExpr)
		if !ok {
			continue
		}
		x, ok := sel.X.(*ast.Ident)
		if !ok {
			continue
		}
		path := importPath(f.file, x.Name)
		rel, ok := strings.CutPrefix(path, mod.path+"/")
		if !ok {
			continue // outside the module: its own API, not ours
		}
		target, err := parseDir(token.NewFileSet(), filepath.Join(mod.root, filepath.FromSlash(rel)))
		if err != nil {
			out = append(out, fmt.Sprintf("%s: type %s: its target %s does not parse: %v", pkg, ts.Name.Name, path, err))
			continue
		}
		for _, tf := range target {
			for _, td := range tf.file.Decls {
				out = append(out, targetMembers(tf.fset, pkg, ts.Name.Name, sel.Sel.Name, td)...)
			}
		}
	}
	return out
}

// targetMembers lists the members of the type named target declared in d
// (its fields and interface methods, or d itself when it is a method of
// target), named by alias.
func targetMembers(fset *token.FileSet, pkg, alias, target string, d ast.Decl) []string {
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Recv == nil || len(d.Recv.List) == 0 || !d.Name.IsExported() || typeName(d.Recv.List[0].Type) != target {
			return nil
		}
		return []string{fmt.Sprintf("%s: func (%s) %s%s", pkg, alias, d.Name.Name, strings.TrimPrefix(node(fset, d.Type), "func"))}
	case *ast.GenDecl:
		for _, s := range d.Specs {
			if ts, ok := s.(*ast.TypeSpec); ok && ts.Name.Name == target {
				named := *ts
				named.Name = ast.NewIdent(alias)
				return members(fset, pkg, &named)
			}
		}
	}
	return nil
}

// importPath is the path f imports under name (its last element, or the
// name it gives it).
func importPath(f *ast.File, name string) string {
	for _, im := range f.Imports {
		p := strings.Trim(im.Path.Value, `"`)
		if im.Name != nil {
			if im.Name.Name == name {
				return p
			}
			continue
		}
		if p[strings.LastIndexByte(p, '/')+1:] == name {
			return p
		}
	}
	return ""
}

func decl(fset *token.FileSet, pkg string, d ast.Decl) []string {
	var out []string
	switch d := d.(type) {
	case *ast.FuncDecl:
		if !d.Name.IsExported() {
			return nil
		}
		recv := ""
		if d.Recv != nil && len(d.Recv.List) > 0 {
			t := typeName(d.Recv.List[0].Type)
			if !ast.IsExported(t) {
				return nil
			}
			recv = "(" + t + ") "
		}
		out = append(out, fmt.Sprintf("%s: func %s%s%s", pkg, recv, d.Name.Name, strings.TrimPrefix(node(fset, d.Type), "func")))
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				if !s.Name.IsExported() {
					continue
				}
				if s.Assign.IsValid() {
					out = append(out, fmt.Sprintf("%s: type %s = %s", pkg, s.Name.Name, node(fset, s.Type)))
				} else {
					out = append(out, fmt.Sprintf("%s: type %s %s", pkg, s.Name.Name, kind(s.Type)))
				}
				out = append(out, members(fset, pkg, s)...)
			case *ast.ValueSpec:
				for _, n := range s.Names {
					if n.IsExported() {
						out = append(out, fmt.Sprintf("%s: %s %s", pkg, d.Tok, n.Name))
					}
				}
			}
		}
	}
	return out
}

func members(fset *token.FileSet, pkg string, s *ast.TypeSpec) []string {
	var out []string
	switch t := s.Type.(type) {
	case *ast.StructType:
		for _, f := range t.Fields.List {
			for _, n := range f.Names {
				if n.IsExported() {
					out = append(out, fmt.Sprintf("%s: field %s.%s %s", pkg, s.Name.Name, n.Name, node(fset, f.Type)))
				}
			}
			if len(f.Names) == 0 && ast.IsExported(typeName(f.Type)) {
				out = append(out, fmt.Sprintf("%s: field %s.%s (embedded)", pkg, s.Name.Name, typeName(f.Type)))
			}
		}
	case *ast.InterfaceType:
		for _, m := range t.Methods.List {
			for _, n := range m.Names {
				if n.IsExported() {
					out = append(out, fmt.Sprintf("%s: method %s.%s%s", pkg, s.Name.Name, n.Name, strings.TrimPrefix(node(fset, m.Type), "func")))
				}
			}
		}
	}
	return out
}

func kind(t ast.Expr) string {
	switch t.(type) {
	case *ast.StructType:
		return "struct"
	case *ast.InterfaceType:
		return "interface"
	case *ast.FuncType:
		return "func"
	}
	return "(" + typeName(t) + ")"
}

func typeName(t ast.Expr) string {
	switch t := t.(type) {
	case *ast.StarExpr:
		return typeName(t.X)
	case *ast.Ident:
		return t.Name
	case *ast.IndexExpr:
		return typeName(t.X)
	case *ast.IndexListExpr:
		return typeName(t.X)
	case *ast.SelectorExpr:
		return typeName(t.X) + "." + t.Sel.Name
	case *ast.ArrayType:
		return "[]" + typeName(t.Elt)
	case *ast.MapType:
		return "map"
	}
	return fmt.Sprintf("%T", t)
}

func node(fset *token.FileSet, n ast.Node) string {
	var b bytes.Buffer
	_ = printer.Fprint(&b, fset, n)
	return strings.Join(strings.Fields(b.String()), " ")
}
