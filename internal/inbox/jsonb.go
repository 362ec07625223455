package inbox

import (
	"encoding/json"
	"unicode/utf8"
)

// What PostgreSQL's jsonb refuses in text that is valid JSON (RFC 8259, and
// what Go's encoding/json and json.Valid accept), all of it inside strings:
//   - the escape \u0000 (text cannot hold U+0000);
//   - a surrogate escape that is not part of a high-low pair ("\ud800",
//     "\udc00", "\ud800\u0041");
//   - bytes that are not UTF-8 (the text parameter itself is refused).
//
// Customer text (names, descriptions, metadata) reaches events verbatim, so a
// verified event may carry any of these. jsonbText rewrites each to U+FFFD
// and reports whether it changed anything; Store then keeps the exact bytes
// in payload_raw.

// replacement is U+FFFD as a JSON escape, so the rewrite stays ASCII.
const replacement = `\ufffd`

// jsonbText returns body with every sequence jsonb refuses replaced by
// U+FFFD, and whether there was any. body must be valid JSON; it is returned
// as is (not copied) when nothing needed replacing.
func jsonbText(body []byte) ([]byte, bool) {
	var out []byte // allocated at the first replacement
	done := 0      // body[:done] is already in out
	replace := func(from, to int) {
		if out == nil {
			out = make([]byte, 0, len(body)+8)
		}
		out = append(out, body[done:from]...)
		out = append(out, replacement...)
		done = to
	}
	inString := false
	for i := 0; i < len(body); {
		c := body[i]
		switch {
		case !inString:
			if c == '"' {
				inString = true
			}
			i++
		case c == '"':
			inString = false
			i++
		case c == '\\' && i+1 < len(body) && body[i+1] == 'u':
			r, ok := hex4(body, i+2)
			switch {
			case !ok:
				// Not valid JSON; leave it for PostgreSQL to refuse.
				i += 2
			case r == 0:
				replace(i, i+6)
				i += 6
			case r >= 0xD800 && r <= 0xDBFF:
				if i+12 <= len(body) && body[i+6] == '\\' && body[i+7] == 'u' {
					if lo, ok := hex4(body, i+8); ok && lo >= 0xDC00 && lo <= 0xDFFF {
						i += 12 // a pair
						continue
					}
				}
				replace(i, i+6)
				i += 6
			case r >= 0xDC00 && r <= 0xDFFF:
				replace(i, i+6)
				i += 6
			default:
				i += 6
			}
		case c == '\\':
			i += 2 // \" \\ \/ \b \f \n \r \t
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(body[i:])
			if r == utf8.RuneError && size == 1 {
				replace(i, i+1)
			}
			i += size
		}
	}
	if out == nil {
		return body, false
	}
	return append(out, body[done:]...), true
}

// hex4 decodes the four hex digits at b[i:i+4].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// rawOnlyMarker is the payload of a receipt whose text jsonb refused even
// after jsonbText's repairs (nothing Stripe sends is known to need it: a
// number beyond numeric's range would). It names the event so an operator
// can find it; the event itself is in payload_raw.
func rawOnlyMarker(id, typ string) []byte {
	b, _ := json.Marshal(map[string]any{"id": id, "type": typ, "object": "event", "inbox_payload_raw_only": true})
	return b
}
