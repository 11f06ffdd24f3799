package slurm

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestExpandHostlist(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // space-separated; "" means an error
	}{
		{"node1", "node1"},
		{"node[1-3]", "node1 node2 node3"},
		{"node[1-3,7],gpu[01-04]", "node1 node2 node3 node7 gpu01 gpu02 gpu03 gpu04"},
		{"a,b,c", "a b c"},
		{"gpu[08-11]", "gpu08 gpu09 gpu10 gpu11"},
		{"n[098-101]", "n098 n099 n100 n101"},
		{"r[1-2]n[1-2]", "r1n1 r1n2 r2n1 r2n2"},
		{"rack[1-2]-node[3]", "rack1-node3 rack2-node3"},
		{"node[2-3],node1", "node2 node3 node1"},
		{"node-a.example.org", "node-a.example.org"},
		{"x[0]", "x0"},
		{"[1-2]", "1 2"},
		{"", ""},
		{"node[", ""},
		{"node]", ""},
		{"node[3-1]", ""},
		{"node[a-b]", ""},
		{"node[1-]", ""},
		{"node[]", ""},
		{"node[1,,2]", ""},
		{"node1,,node2", ""},
		{"node[[1]]", ""},
		{"node[1-99999999]", ""},
		{"node[1-300]x[1-300]", ""},
		{"node 1", ""},
	} {
		got, err := ExpandHostlist(tc.in)
		if tc.want == "" {
			if err == nil || !errors.Is(err, ErrHostlist) {
				t.Errorf("ExpandHostlist(%q) = %q, %v; want an ErrHostlist", tc.in, got, err)
			}
			continue
		}
		if err != nil || strings.Join(got, " ") != tc.want {
			t.Errorf("ExpandHostlist(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestParseTasksPerNode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
	}{
		{"1", []int{1}},
		{"1(x2)", []int{1, 1}},
		{"2(x3),1", []int{2, 2, 2, 1}},
		{"4,2(x2)", []int{4, 2, 2}},
		{"", nil},
		{"0", nil},
		{"2(x0)", nil},
		{"2(x3", nil},
		{"x", nil},
		{"1(x99999999)", nil},
	} {
		got, err := ParseTasksPerNode(tc.in)
		if tc.want == nil {
			if err == nil {
				t.Errorf("ParseTasksPerNode(%q) = %v; want an error", tc.in, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseTasksPerNode(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// FuzzExpandHostlist: any input is an error or a bounded list of names
// without separators, and a plain list of the names expands to itself.
func FuzzExpandHostlist(f *testing.F) {
	for _, s := range []string{"node[1-3,7],gpu[01-04]", "a,b", "r[1-2]n[01-03]", "x[", "n[5-1]", "n[1-99999]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hosts, err := ExpandHostlist(s)
		if err != nil {
			if !errors.Is(err, ErrHostlist) {
				t.Fatalf("error %v does not wrap ErrHostlist", err)
			}
			return
		}
		if len(hosts) == 0 || len(hosts) > maxHosts {
			t.Fatalf("%q: %d hosts", s, len(hosts))
		}
		for _, h := range hosts {
			if h == "" || strings.ContainsAny(h, "[],") {
				t.Fatalf("%q expands to the name %q", s, h)
			}
		}
		again, err := ExpandHostlist(strings.Join(hosts, ","))
		if err != nil || !slices.Equal(again, hosts) {
			t.Fatalf("%q: its expansion %q read back as %q, %v", s, hosts, again, err)
		}
	})
}
