package approle

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
)

// scramIterations is PostgreSQL's default (scram_iterations).
const scramIterations = 4096

// Passwords are the login roles' passwords (from their secrets). Legacy is
// needed only when Roles.Legacy is set.
type Passwords struct {
	Webhook, Worker, Purge string
	Ops                    string // needed only when Roles.Ops is set
	Reconcile              string // needed only when Roles.Reconcile is set
	Ingest                 string // needed only when Roles.Ingest is set
	Writeback              string // needed only when Roles.Writeback is set
	Legacy                 string
}

func (p Passwords) of(function string) string {
	switch function {
	case "webhook":
		return p.Webhook
	case "worker":
		return p.Worker
	case "ops":
		return p.Ops
	case "reconcile":
		return p.Reconcile
	case "ingest":
		return p.Ingest
	case "writeback":
		return p.Writeback
	default:
		return p.Purge
	}
}

// scramVerifier hashes password the way PostgreSQL stores it
// (SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>, RFC 5802 and
// RFC 7677), so the server receives a verifier rather than the password.
func scramVerifier(password string) (string, error) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("generating a salt: %w", err)
	}
	return scramVerifierWithSalt(password, salt, scramIterations)
}

func scramVerifierWithSalt(password string, salt []byte, iterations int) (string, error) {
	if err := CheckPassword(password); err != nil {
		return "", err
	}
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return "", fmt.Errorf("deriving the SCRAM key: %w", err)
	}
	clientKey := hmacSHA256(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	serverKey := hmacSHA256(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(storedKey[:]), b64(serverKey)), nil
}

func hmacSHA256(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

// CheckPassword accepts printable ASCII of a sensible length: SASLprep (which
// PostgreSQL applies before hashing) leaves such passwords unchanged, so the
// verifier computed here matches the one the server would compute.
func CheckPassword(password string) error {
	if len(password) < 16 || len(password) > 256 {
		return fmt.Errorf("the password must be 16 to 256 characters, got %d", len(password))
	}
	for _, r := range password {
		if r < 0x21 || r > 0x7e {
			return errors.New("the password must be printable ASCII without spaces")
		}
	}
	return nil
}

// PasswordFromSecret extracts the password from a secret in the standard RDS
// DatabaseSecret shape ({"username": ..., "password": ...}) and checks that
// the secret is the one for user.
func PasswordFromSecret(text, user string) (string, error) {
	var s struct {
		Username string `json:"username"`
		Password string `json:"password"`
	}
	if err := json.Unmarshal([]byte(text), &s); err != nil {
		return "", fmt.Errorf("the secret of role %s is not JSON with username and password fields", user)
	}
	if s.Username != user {
		return "", fmt.Errorf("the secret is for user %q, but the role is %q", s.Username, user)
	}
	if err := CheckPassword(s.Password); err != nil {
		return "", fmt.Errorf("the secret of role %s: %w", user, err)
	}
	return s.Password, nil
}
