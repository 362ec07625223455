// Package approle keeps the database roles of a deployment in the shape the
// functions need, and runs the deploy-time database step (roles, migrations,
// grants) that the migrate function performs.
//
// Roles (names are configuration; the stack's are in parentheses):
//
//   - the owner (inbox_schema_owner): NOLOGIN. It owns every object of schema
//     public, and migrations run as it (the master user SET ROLEs to it), so
//     nobody logs in as the owner of the schema.
//
//   - the webhook's user (inbox_webhook): INSERT on the columns of
//     webhook_inbox a receipt is stored with, SELECT of the receipt key
//     (provider, endpoint, event_id), SELECT and UPDATE of duplicates (a
//     duplicate delivery counts itself), and what its delivery needs to
//     replace a copy the reconciler listed first: UPDATE of payload,
//     payload_raw, api_version, secret_fingerprint, signed_at, source and
//     listed_first, SELECT of source, processed_at and listed_first.
//     Nothing else: it cannot read payloads, change a receipt's processing
//     state, delete one, or touch any other table.
//
//   - the reconciler's store function's user (inbox_reconcile; optional,
//     Roles.Reconcile): the webhook's INSERT on webhook_inbox (store a
//     receipt, read back its key), and SELECT, INSERT and UPDATE on
//     reconcile_high_water (the reconciler's mark). Nothing else.
//
//   - the EventBridge ingest function's user (inbox_ingest; optional,
//     Roles.Ingest): the webhook's store on webhook_inbox (INSERT, SELECT of
//     the key, and the UPDATE and SELECT its delivery needs to replace a
//     copy the reconciler listed first). Nothing else.
//
//   - the write-back store function's user (inbox_writeback; optional,
//     Roles.Writeback): what internal/writeback.DBStore runs on
//     writeback_intents: SELECT of the columns its claim, record and
//     backlog statements read, UPDATE of the sender's columns (attempts,
//     lease, token, status, result, last error). No INSERT, no DELETE,
//     nothing else.
//
//   - the purge's user (inbox_purge): what internal/retention runs: SELECT
//     and DELETE on webhook_inbox and outbox, UPDATE of webhook_inbox.payload and
//     payload_raw (scrubbing) and of outbox.created_at (only so that its batches may
//     lock rows FOR UPDATE). Nothing on the business tables.
//
//   - the worker's user (inbox_worker): exactly the statements it runs
//     (workerGrants, column by column): on webhook_inbox, SELECT of what it
//     reads and UPDATE of attempts, available_at, last_error, processed_at
//     and outcome; on ledger_entries, INSERT and UPDATE of invoice_id only
//     (a refund's entries move to its invoice); INSERT and UPDATE of the
//     columns its upserts write on invoices, refunds and payment_links;
//     INSERT on anomalies; INSERT on outbox and UPDATE of the relay's
//     columns. No DELETE anywhere, nothing on reconcile_high_water,
//     ops_audit or schema_migrations, no sequence, no default privileges:
//     a table a later migration creates is not the worker's until a release
//     grants it here.
//
//   - the operators' user (inbox_ops; optional, Roles.Ops): what internal/ops
//     runs for inboxctl: SELECT on webhook_inbox and the business tables it
//     shows, UPDATE of webhook_inbox.attempts and available_at (retry),
//     UPDATE of anomalies.resolved_at and resolution (resolve), UPDATE of
//     outbox.attempts, available_at, leased_until and claim_token
//     (outbox-retry; never published_at or the payload), and INSERT
//     and SELECT on ops_audit. It cannot store, process, delete or scrub
//     receipts, book money, change or delete an audit row, or touch a table
//     a later migration creates until a release grants it here.
//
// None of them may create, alter or drop objects, nor create temporary
// tables (the database's TEMPORARY privilege is taken from PUBLIC and from
// each of them).
//
// The earlier release's shared login (inbox_app) is retired in two phases, so
// that neither the deploy window nor a rollback cuts the previous functions
// off the database:
//
//   - kept (Roles.Legacy; the stack's keepLegacyAppRole=true, for the one
//     deploy that upgrades from the shared-role release): if the role exists, it keeps
//     exactly what the earlier release gave it: LOGIN with its secret's
//     password, CONNECT and TEMPORARY on the database, USAGE on the schema,
//     SELECT, INSERT, UPDATE and DELETE on every table (including the tables
//     later migrations create, which the owner now owns), USAGE and SELECT on
//     the sequences, and SELECT only on schema_migrations. It is never
//     created: a database where it never existed (a new stack) does not get it.
//   - retired (Roles.Retired; the stack's default, from the deploy after
//     the upgrade on): stripped of every privilege and made NOLOGIN; an operator
//     drops it. The step refuses to retire a role while the functions' own
//     roles do not exist yet: that deploy would switch the functions and
//     lock out the role the running ones use in one go.
//
// The deploy step connects as the RDS master user. On RDS that user is not a
// PostgreSQL superuser: it is created NOSUPERUSER with CREATEROLE and CREATEDB
// and is a member of rds_superuser, which lets it create roles and grant
// privileges
// (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/Appendix.PostgreSQL.CommonDBATasks.Roles.rds_superuser.html).
// It owns the database RDS created for it (DatabaseName), and so schema public
// through pg_database_owner (PostgreSQL 15+). Everything here is therefore done
// with ordinary privileges: the master creates the roles (on PostgreSQL 16+ a
// CREATEROLE user gets ADMIN OPTION, but neither SET nor INHERIT, on the roles
// it creates, and needs that ADMIN OPTION for ALTER ROLE and GRANT), grants
// itself membership in the owner WITH INHERIT TRUE, SET TRUE (the explicit
// form of what createrole_self_grant would do,
// https://www.postgresql.org/docs/16/runtime-config-client.html#GUC-CREATEROLE-SELF-GRANT),
// hands the owner the objects it still owns itself (deployments before this
// change ran migrations as the master), and SET ROLEs to the owner for
// migrations and grants. The tests run the step as a non-superuser
// CREATEROLE login that owns the database, as the master is on RDS.
//
// The login roles reach PostgreSQL only through RDS Proxy. The functions
// authenticate to the proxy with IAM tokens; the proxy logs in to the
// database with the user name and password stored in each role's Secrets
// Manager secret (one secret per user, each registered with the proxy). So
// each role must exist with exactly that password and is never a member of
// rds_iam (on RDS that membership turns off password logins for the role,
// which would lock the proxy out).
//
// By job: roles.go names the roles and creates or updates them (Prepare,
// before the migrations), grants.go gives each its privileges (Grant,
// after them), passwords.go turns a secret's password into the SCRAM
// verifier PostgreSQL stores, and deploy.go runs the whole step.
package approle

// lockKey serialises deploy steps ("inbox-ro" as ASCII), so two deploys
// racing to create a role do not fail on a duplicate.
const lockKey int64 = 0x696e626f782d726f
