import { type Kysely, sql } from "kysely";
import type { Migration, MigrationProvider } from "kysely/migration";

export type DialectName = "sqlite" | "postgres";

/** Every schema change, in order. Both dialects run the same migrations. */
const migrations = (dialect: DialectName): Record<string, Migration> => ({
  "0001_initial": {
    async up(db: Kysely<any>) {
      const bigint = "bigint" as const;
      await db.schema
        .createTable("peers")
        .addColumn("public_key", "text", (c) => c.primaryKey())
        .addColumn("role", "text", (c) => c.notNull())
        .addColumn("status", "text", (c) => c.notNull())
        .addColumn("device_info", "text", (c) => c.notNull().defaultTo("{}"))
        .addColumn("created_at", bigint, (c) => c.notNull())
        .addColumn("updated_at", bigint, (c) => c.notNull())
        .execute();

      await db.schema
        .createTable("sessions")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("token_hash", "text", (c) => c.notNull().unique())
        .addColumn("kind", "text", (c) => c.notNull())
        .addColumn("public_key", "text", (c) => c.notNull())
        .addColumn("target_key", "text")
        .addColumn("created_at", bigint, (c) => c.notNull())
        .addColumn("expires_at", bigint, (c) => c.notNull())
        .addColumn("revoked_at", bigint)
        .execute();
      await db.schema.createIndex("sessions_target").on("sessions").columns(["target_key", "created_at"]).execute();
      await db.schema.createIndex("sessions_expires").on("sessions").column("expires_at").execute();

      await db.schema
        .createTable("device_tokens")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("token_hash", "text", (c) => c.notNull().unique())
        .addColumn("target_key", "text", (c) => c.notNull())
        .addColumn("created_at", bigint, (c) => c.notNull())
        .addColumn("expires_at", bigint, (c) => c.notNull())
        .addColumn("consumed_at", bigint)
        .execute();
      await db.schema.createIndex("device_tokens_target").on("device_tokens").column("target_key").execute();
      await db.schema.createIndex("device_tokens_expires").on("device_tokens").column("expires_at").execute();

      // The primary keys are what make a nonce single-use across processes.
      for (const table of ["assertion_nonces", "signaling_nonces"]) {
        await db.schema
          .createTable(table)
          .addColumn("public_key", "text", (c) => c.notNull())
          .addColumn("nonce", "text", (c) => c.notNull())
          .addColumn("expires_at", bigint, (c) => c.notNull())
          .addPrimaryKeyConstraint(`${table}_pk`, ["public_key", "nonce"])
          .execute();
        await db.schema.createIndex(`${table}_expires`).on(table).column("expires_at").execute();
      }

      await db.schema
        .createTable("peer_status")
        .addColumn("public_key", "text", (c) => c.primaryKey())
        .addColumn("document", "text", (c) => c.notNull())
        .addColumn("updated_at", bigint, (c) => c.notNull())
        .execute();

      await db.schema
        .createTable("peer_runtime")
        .addColumn("public_key", "text", (c) => c.primaryKey())
        .addColumn("online", "integer", (c) => c.notNull())
        .addColumn("last_seen_at", bigint)
        .addColumn("last_addr", "text")
        .addColumn("rx_bytes", bigint)
        .addColumn("tx_bytes", bigint)
        .addColumn("node", "text")
        .addColumn("updated_at", bigint, (c) => c.notNull())
        .execute();

      // Clustered on (peer, field, time) so range and aggregate queries read one contiguous run.
      await db.schema
        .createTable("telemetry_samples")
        .addColumn("public_key", "text", (c) => c.notNull())
        .addColumn("field", "text", (c) => c.notNull())
        .addColumn("observed_at", bigint, (c) => c.notNull())
        .addColumn("value", "double precision", (c) => c.notNull())
        .addPrimaryKeyConstraint("telemetry_samples_pk", ["public_key", "field", "observed_at"])
        .$call((b) => (dialect === "sqlite" ? b.modifyEnd(sql`without rowid`) : b))
        .execute();

      await db.schema
        .createTable("contacts")
        .addColumn("public_key", "text", (c) => c.notNull())
        .addColumn("name", "text", (c) => c.notNull())
        .addColumn("display_name", "text")
        .addColumn("phone_number", "text")
        .addColumn("phone_digits", "text")
        .addColumn("created_at", bigint, (c) => c.notNull())
        .addColumn("updated_at", bigint, (c) => c.notNull())
        .addPrimaryKeyConstraint("contacts_pk", ["public_key", "name"])
        .addUniqueConstraint("contacts_phone_unique", ["public_key", "phone_digits"])
        .execute();
    },
  },
});

export function migrationProvider(dialect: DialectName): MigrationProvider {
  return { getMigrations: async () => migrations(dialect) };
}
