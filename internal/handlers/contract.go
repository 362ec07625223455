package handlers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A handler's contract is the part of the event it reads: each field, the
// JSON types it accepts and whether null or absence is allowed. The handlers
// do not depend on an API version: an event of any version whose fields
// satisfy the contract is booked, and one whose fields do not fails with a
// *ContractError that names the field, the event type and the API version,
// before anything is booked (the receipt waits for review once its attempts
// are used up). That is what lets a release the code has not named be booked
// when its shape holds (releases.go), and stops it when it does not: never a
// wrong booking, never a guess.
//
// The payload is decoded once, by encoding/json into the handler's struct,
// whose contract fields are the types below: each records the JSON type the
// payload had (or that the field was absent) while it decodes. After the
// decode, the struct's contract method states what it requires, field by
// field (see invoice.contract in invoices.go):
//
//	c.want("amount_paid", inv.AmountPaid.Kind, Integer)
//	c.want("charge", inv.Charge.Kind, Ref|Null|Absent)
//
// A new handler (issue 23's disputes, say) declares its object's struct with
// these field types, writes its contract method, and registers itself with
// on[T] (handlers.go); decode, the version and the error come with it.

// Kind is the JSON type a contract field had in the payload.
type Kind uint8

const (
	// KindAbsent: the field was not in the payload.
	KindAbsent Kind = iota
	KindNull
	KindString
	KindInteger // a number without fraction or exponent that fits an int64
	KindNumber  // any other number
	KindObject
	KindArray
	KindBool
	// KindObjectWithoutID: an object where an id or an expanded object
	// with an id was expected, but without a string id.
	KindObjectWithoutID
)

var kindNames = [...]string{
	KindAbsent: "absent", KindNull: "null", KindString: "a string", KindInteger: "an integer", KindNumber: "a number",
	KindObject: "an object", KindArray: "an array", KindBool: "a boolean", KindObjectWithoutID: "an object without a string id",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind " + strconv.Itoa(int(k))
}

// Kinds is a set of accepted kinds.
type Kinds uint16

// The sets a contract accepts.
const (
	Absent  Kinds = 1 << KindAbsent
	Null    Kinds = 1 << KindNull
	String  Kinds = 1 << KindString
	Integer Kinds = 1 << KindInteger
	Object  Kinds = 1 << KindObject
	Array   Kinds = 1 << KindArray
	Bool    Kinds = 1 << KindBool
	// Ref is an expandable field: an id, or the expanded object with its id.
	Ref = String | Object
)

func (ks Kinds) has(k Kind) bool { return ks&(1<<k) != 0 }

func (ks Kinds) String() string {
	var names []string
	if ks&Ref == Ref {
		names = append(names, "an id (a string) or an expanded object")
	}
	for k := KindNull; k <= KindBool; k++ {
		if ks.has(k) && !(ks&Ref == Ref && (k == KindString || k == KindObject)) {
			names = append(names, k.String())
		}
	}
	if ks.has(KindAbsent) {
		names = append(names, "absent")
	}
	return strings.Join(names, " or ")
}

// kindOf is the kind of a JSON value from its text (encoding/json hands
// UnmarshalJSON a complete, valid value).
func kindOf(b []byte) Kind {
	if len(b) == 0 {
		return KindAbsent
	}
	switch b[0] {
	case 'n':
		return KindNull
	case '"':
		return KindString
	case '{':
		return KindObject
	case '[':
		return KindArray
	case 't', 'f':
		return KindBool
	}
	return KindNumber
}

// Str is a contract field read as a string.
type Str struct {
	V    string
	Kind Kind
}

// UnmarshalJSON records the kind and, for a string, its value.
func (s *Str) UnmarshalJSON(b []byte) error {
	s.Kind = kindOf(b)
	if s.Kind == KindString {
		return unquote(b, &s.V)
	}
	return nil
}

// unquote decodes a JSON string: without escapes (ids, currencies,
// statuses) it is the bytes between the quotes, which encoding/json has
// already checked; otherwise encoding/json decodes it.
func unquote(b []byte, v *string) error {
	inner := b[1 : len(b)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		*v = string(inner)
		return nil
	}
	return json.Unmarshal(b, v)
}

// Int is a contract field read as an integer (an amount in minor units, a
// timestamp).
type Int struct {
	V    int64
	Kind Kind
}

// UnmarshalJSON records the kind and, for an integer, its value. A number
// with a fraction or an exponent, or beyond int64, is KindNumber: the
// contract refuses it rather than rounding money.
func (n *Int) UnmarshalJSON(b []byte) error {
	n.Kind = kindOf(b)
	if n.Kind == KindNumber {
		if v, err := strconv.ParseInt(string(b), 10, 64); err == nil {
			n.V, n.Kind = v, KindInteger
		}
	}
	return nil
}

// Flag is a contract field read as a boolean.
type Flag struct {
	V    bool
	Kind Kind
}

// UnmarshalJSON records the kind and, for a boolean, its value.
func (f *Flag) UnmarshalJSON(b []byte) error {
	f.Kind = kindOf(b)
	f.V = f.Kind == KindBool && b[0] == 't'
	return nil
}

// ID is a contract field read as the id of an expandable object: an id
// (string), or the expanded object, whose id it reads.
type ID struct {
	V    string
	Kind Kind
}

// UnmarshalJSON records the kind and the id. An object whose id is not a
// string is KindObjectWithoutID.
func (r *ID) UnmarshalJSON(b []byte) error {
	r.Kind = kindOf(b)
	switch r.Kind {
	case KindString:
		return unquote(b, &r.V)
	case KindObject:
		var o struct {
			ID Str `json:"id"`
		}
		if err := json.Unmarshal(b, &o); err != nil {
			return err
		}
		if o.ID.Kind != KindString || o.ID.V == "" {
			r.Kind = KindObjectWithoutID
		}
		r.V = o.ID.V
	}
	return nil
}

// ErrContract means a field a handler reads is missing or of another JSON
// type than its contract accepts (or holds a value the handler does not
// know). It is an ErrBadPayload: retrying cannot help, nothing was booked,
// and the receipt waits for review once its attempts are used up. The error
// is a *ContractError, which names the field.
var ErrContract = fmt.Errorf("%w: a field its handler reads is missing or of another type", ErrBadPayload)

// ContractError says which field broke the contract, of which event.
type ContractError struct {
	EventID    string
	EventType  string
	APIVersion string // "" when the event has none
	Field      string // the path in the event, e.g. data.object.amount_paid
	Want       string // what the contract accepts
	Got        string // what the payload had
}

func (e *ContractError) Error() string {
	v := e.APIVersion
	if v == "" {
		v = "none"
	}
	got := "is " + e.Got
	if e.Got == KindAbsent.String() {
		got = "is missing"
	}
	return fmt.Sprintf("event %s (%s, api_version %s): %s %s; its handler reads %s", e.EventID, e.EventType, v, e.Field, got, e.Want)
}

// Unwrap makes a ContractError an ErrContract (and so an ErrBadPayload).
func (e *ContractError) Unwrap() error { return ErrContract }

// checker collects the first violation of a contract. Paths are relative to
// its prefix (data.object for the event's object).
type checker struct {
	prefix string
	bad    *ContractError
}

func (c *checker) path(field string) string {
	if c.prefix == "" {
		return field
	}
	return c.prefix + "." + field
}

// want checks that a field's kind is one of want.
func (c *checker) want(field string, got Kind, want Kinds) {
	if c.bad == nil && !want.has(got) {
		c.bad = &ContractError{Field: c.path(field), Want: want.String(), Got: got.String()}
	}
}

// oneOf checks that a string field (already checked by want) holds one of
// the values the handler knows: a value a later release adds is not guessed at.
func (c *checker) oneOf(field string, s Str, values ...string) {
	if c.bad == nil && s.Kind == KindString && !contains(values, s.V) {
		c.bad = &ContractError{Field: c.path(field), Want: "one of " + strings.Join(values, ", "), Got: strconv.Quote(s.V)}
	}
}

// positive checks that an integer field (already checked by want) is > 0.
func (c *checker) positive(field string, n Int) {
	if c.bad == nil && n.Kind == KindInteger && n.V <= 0 {
		c.bad = &ContractError{Field: c.path(field), Want: "an integer above 0", Got: strconv.FormatInt(n.V, 10)}
	}
}

// nonEmpty checks that a string or id field (already checked by want), when
// present, is not "".
func (c *checker) nonEmpty(field string, k Kind, v string) {
	if c.bad == nil && k == KindString && v == "" {
		c.bad = &ContractError{Field: c.path(field), Want: "a non-empty string", Got: `""`}
	}
}

// in runs f with paths under field (an element of a list: "data[2]").
func (c *checker) in(field string, f func(*checker)) {
	if c.bad != nil {
		return
	}
	sub := checker{prefix: c.path(field)}
	f(&sub)
	c.bad = sub.bad
}

func contains(values []string, v string) bool {
	for _, x := range values {
		if x == v {
			return true
		}
	}
	return false
}

// contracted is a handler's object: a struct whose contract method checks
// what the handler reads.
type contracted[T any] interface {
	*T
	contract(c *checker)
}

// envelope is the event around the object: what every handler may read.
type envelope[T any] struct {
	APIVersion Str `json:"api_version"`
	Created    Int `json:"created"`
	Data       struct {
		Object T `json:"object"`
	} `json:"data"`
}

// Meta is what a handler reads of the event besides its object.
type Meta struct {
	APIVersion string // "" when the event has none
	Created    int64  // the event's created (seconds)
}

// decode parses ev.Payload once into T and checks the envelope and T's
// contract. A violation is a *ContractError naming the field; a payload
// that is not a JSON object is ErrBadPayload.
func decode[T any, P contracted[T]](ev Event) (T, Meta, error) {
	var env envelope[T]
	err := json.Unmarshal(ev.Payload, &env)
	meta := Meta{APIVersion: env.APIVersion.V, Created: env.Created.V}
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &typeErr):
		// A value encoding/json could not put in a plain Go field (a list
		// that is not an array, an object that is a string): the field is
		// named by its path (list elements without their index).
		return env.Data.Object, meta, contractError(ev, meta, &ContractError{Field: typeErr.Field, Want: goKind(typeErr), Got: "a JSON " + typeErr.Value})
	case err != nil:
		return env.Data.Object, meta, fmt.Errorf("%w: event %s (%s): %v", ErrBadPayload, ev.ID, ev.Type, err)
	}
	c := checker{}
	c.want("api_version", env.APIVersion.Kind, String|Null|Absent)
	c.want("created", env.Created.Kind, Integer)
	c.in("data.object", P(&env.Data.Object).contract)
	if c.bad != nil {
		return env.Data.Object, meta, contractError(ev, meta, c.bad)
	}
	return env.Data.Object, meta, nil
}

func contractError(ev Event, meta Meta, e *ContractError) error {
	e.EventID, e.EventType, e.APIVersion = ev.ID, ev.Type, meta.APIVersion
	return e
}

// goKind names what a plain Go field of a contract struct accepts.
func goKind(e *json.UnmarshalTypeError) string {
	switch e.Type.Kind().String() {
	case "slice":
		return "an array"
	case "struct", "ptr", "map":
		return "an object"
	}
	return e.Type.String()
}
