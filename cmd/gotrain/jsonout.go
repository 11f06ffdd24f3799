package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"math"
	"slices"
	"strconv"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// gotrain's --json output follows one convention, whatever the command
// (diagnose, top): field names as in the .proto (snake_case), every field
// present with its zero value (rank 0 has "rank": 0; an unset message is
// null), and numbers as JSON numbers, int64 too (not the strings of the
// proto3 JSON mapping). writeJSON writes either kind of value so.

// writeJSON writes v, a proto message or a value encoding/json takes, as
// one JSON document and a newline; indented when indent.
func writeJSON(w io.Writer, v any, indent bool) error {
	var b []byte
	if m, ok := v.(proto.Message); ok {
		b = appendMessage(nil, m.ProtoReflect())
	} else {
		var err error
		if b, err = json.Marshal(v); err != nil {
			return err
		}
	}
	if indent {
		var out bytes.Buffer
		if err := json.Indent(&out, b, "", "  "); err != nil {
			return err
		}
		b = out.Bytes()
	}
	_, err := w.Write(append(b, '\n'))
	return err
}

// appendMessage appends m's fields in their .proto order; a oneof's unset
// members are left out.
func appendMessage(b []byte, m protoreflect.Message) []byte {
	b = append(b, '{')
	fields := m.Descriptor().Fields()
	n := 0
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() && !m.Has(fd) {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = strconv.AppendQuote(b, string(fd.Name()))
		b = append(b, ':')
		switch {
		case fd.IsList():
			l := m.Get(fd).List()
			b = append(b, '[')
			for j := 0; j < l.Len(); j++ {
				if j > 0 {
					b = append(b, ',')
				}
				b = appendValue(b, fd, l.Get(j))
			}
			b = append(b, ']')
		case fd.IsMap():
			mp := m.Get(fd).Map()
			var keys []protoreflect.MapKey
			mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool { keys = append(keys, k); return true })
			slices.SortFunc(keys, func(x, y protoreflect.MapKey) int {
				switch xs, ys := x.String(), y.String(); {
				case xs < ys:
					return -1
				case xs > ys:
					return 1
				}
				return 0
			})
			b = append(b, '{')
			for j, k := range keys {
				if j > 0 {
					b = append(b, ',')
				}
				b = appendString(b, k.String())
				b = append(b, ':')
				b = appendValue(b, fd.MapValue(), mp.Get(k))
			}
			b = append(b, '}')
		case fd.Message() != nil && !m.Has(fd):
			b = append(b, "null"...)
		default:
			b = appendValue(b, fd, m.Get(fd))
		}
	}
	return append(b, '}')
}

// appendValue appends one value of field fd (an element, for a list).
func appendValue(b []byte, fd protoreflect.FieldDescriptor, v protoreflect.Value) []byte {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return strconv.AppendBool(b, v.Bool())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return strconv.AppendInt(b, v.Int(), 10)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return strconv.AppendUint(b, v.Uint(), 10)
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		f := v.Float()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return appendString(b, strconv.FormatFloat(f, 'g', -1, 64)) // as protojson: "NaN", "+Inf"
		}
		bits := 64
		if fd.Kind() == protoreflect.FloatKind {
			bits = 32
		}
		return strconv.AppendFloat(b, f, 'g', -1, bits)
	case protoreflect.StringKind:
		return appendString(b, v.String())
	case protoreflect.BytesKind:
		return appendString(b, base64.StdEncoding.EncodeToString(v.Bytes()))
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return appendString(b, string(ev.Name()))
		}
		return strconv.AppendInt(b, int64(v.Enum()), 10)
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return appendMessage(b, v.Message())
	}
	return append(b, "null"...)
}

// appendString appends s as a JSON string (encoding/json's escaping).
func appendString(b []byte, s string) []byte {
	q, _ := json.Marshal(s)
	return append(b, q...)
}
