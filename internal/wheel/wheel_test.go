package wheel

import (
	"archive/zip"
	"bytes"
	"strings"
	"testing"
)

func meta() Meta {
	return Meta{Name: "gotrain", Version: "0.9.0", Tag: "py3-none-manylinux_2_34_x86_64", Summary: "s"}
}

func TestWriteThenVerify(t *testing.T) {
	m := meta()
	var b bytes.Buffer
	files := []File{{Name: "gotrain/__init__.py", Data: []byte("x = 1\n")}, {Name: m.ScriptPath("gotrain"), Data: []byte("\x7fELF"), Executable: true}}
	if err := Write(&b, m, files); err != nil {
		t.Fatal(err)
	}
	if err := Verify(bytes.NewReader(b.Bytes()), int64(b.Len())); err != nil {
		t.Fatal(err)
	}
	z, err := zip.NewReader(bytes.NewReader(b.Bytes()), int64(b.Len()))
	if err != nil {
		t.Fatal(err)
	}
	modes := map[string]string{}
	for _, f := range z.File {
		modes[f.Name] = f.Mode().String()
	}
	if modes["gotrain-0.9.0.data/scripts/gotrain"] != "-rwxr-xr-x" || modes["gotrain/__init__.py"] != "-rw-r--r--" {
		t.Errorf("modes %v: the script must be executable, the rest not", modes)
	}
	for _, want := range []string{"gotrain-0.9.0.dist-info/WHEEL", "gotrain-0.9.0.dist-info/METADATA", "gotrain-0.9.0.dist-info/RECORD"} {
		if _, ok := modes[want]; !ok {
			t.Errorf("no %s in %v", want, modes)
		}
	}
	// The same inputs give the same bytes.
	var again bytes.Buffer
	if err := Write(&again, m, files); err != nil || !bytes.Equal(again.Bytes(), b.Bytes()) {
		t.Errorf("a second write differs (err %v)", err)
	}
}

// TestVerifyFindsTampering: a file whose bytes differ from RECORD's hash,
// or one RECORD does not list, is refused.
func TestVerifyFindsTampering(t *testing.T) {
	m := meta()
	var good bytes.Buffer
	if err := Write(&good, m, []File{{Name: "gotrain/a.py", Data: []byte("a = 1\n")}}); err != nil {
		t.Fatal(err)
	}
	rebuild := func(change func(name string, data []byte) (string, []byte)) []byte {
		z, _ := zip.NewReader(bytes.NewReader(good.Bytes()), int64(good.Len()))
		var out bytes.Buffer
		w := zip.NewWriter(&out)
		for _, f := range z.File {
			r, _ := f.Open()
			var data bytes.Buffer
			data.ReadFrom(r)
			r.Close()
			name, d := change(f.Name, data.Bytes())
			fw, _ := w.Create(name)
			fw.Write(d)
		}
		w.Close()
		return out.Bytes()
	}
	changed := rebuild(func(n string, d []byte) (string, []byte) {
		if n == "gotrain/a.py" {
			return n, []byte("import os; os.system('x')\n")
		}
		return n, d
	})
	if err := Verify(bytes.NewReader(changed), int64(len(changed))); err == nil || !strings.Contains(err.Error(), "gotrain/a.py") {
		t.Errorf("changed file: err %v, want it named", err)
	}
	renamed := rebuild(func(n string, d []byte) (string, []byte) {
		if n == "gotrain/a.py" {
			return "gotrain/b.py", d
		}
		return n, d
	})
	if err := Verify(bytes.NewReader(renamed), int64(len(renamed))); err == nil {
		t.Error("a file RECORD does not list passed")
	}
}

func TestBadInputs(t *testing.T) {
	var b bytes.Buffer
	m := meta()
	m.Version = "0.9.0-dirty"
	if err := Write(&b, m, nil); err == nil {
		t.Error("a version that is not a release passed")
	}
	if err := Write(&b, meta(), []File{{Name: "../evil"}}); err == nil {
		t.Error("a path leaving the wheel passed")
	}
	if err := Write(&b, meta(), []File{{Name: "a"}, {Name: "a"}}); err == nil {
		t.Error("a file twice passed")
	}
	if tag, err := PlatformTag("arm64", 34); err != nil || tag != "manylinux_2_34_aarch64" {
		t.Errorf("PlatformTag(arm64, 34) = %q, %v", tag, err)
	}
	if _, err := PlatformTag("riscv64", 34); err == nil {
		t.Error("riscv64 got a tag")
	}
}
