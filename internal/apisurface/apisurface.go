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
// interface methods of exported types.
func Dir(dir, name string) ([]string, error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
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
		for _, d := range f.Decls {
			out = append(out, decl(fset, name, d)...)
		}
	}
	sort.Strings(out)
	return out, nil
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
				out = append(out, fmt.Sprintf("%s: type %s %s", pkg, s.Name.Name, kind(s.Type)))
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
