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
  "0002_peer_cascade_compact_telemetry": {
    up: (db: Kysely<any>) => (dialect === "sqlite" ? peerCascadeSqlite(db) : peerCascadePostgres(db)),
  },
  /** A device's choice of voice agent (voice.md §1): an agent id, `off`, or null for `voice.agent`. */
  "0003_peer_voice_agent": {
    async up(db: Kysely<any>) {
      await db.schema.alterTable("peers").addColumn("voice_agent", "text").execute();
    },
  },
  // One row per node that holds WebRTC connections, its heartbeat written every few seconds: a peer
  // recorded online on a node whose heartbeat stopped is offline (the node died).
  "0004_node_heartbeats": {
    async up(db: Kysely<any>) {
      await db.schema
        .createTable("node_heartbeats")
        .addColumn("node", "text", (c) => c.primaryKey())
        .addColumn("beat_at", "bigint", (c) => c.notNull())
        .execute();
    },
  },
  // One row per open Side Control event stream, written by the node that holds it: the streams of a
  // session are counted across every node sharing the store (only rows of nodes whose heartbeat is
  // fresh count). A session's deletion takes its rows with it.
  "0005_live_streams": {
    async up(db: Kysely<any>) {
      await db.schema
        .createTable("live_streams")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("session_id", "text", (c) => c.notNull().references("sessions.id").onDelete("cascade"))
        .addColumn("node", "text", (c) => c.notNull())
        .addColumn("opened_at", "bigint", (c) => c.notNull())
        .execute();
      await db.schema.createIndex("live_streams_session").on("live_streams").column("session_id").execute();
      await db.schema.createIndex("live_streams_node").on("live_streams").column("node").execute();
    },
  },
  // Bus messages written by a process inside the transaction whose change they announce (a session
  // revoked, a peer blocked or removed), read by the other processes sharing a SQLite file, which
  // have no bus between them (PostgreSQL's NOTIFY carries them there). Kept a minute.
  "0006_bus_messages": {
    async up(db: Kysely<any>) {
      await db.schema
        .createTable("bus_messages")
        // AUTOINCREMENT: ids never come back after the newest rows are deleted, so "after id N" stays true.
        .addColumn("id", dialect === "sqlite" ? "integer" : "bigserial", (c) => (dialect === "sqlite" ? c.primaryKey().autoIncrement() : c.primaryKey()))
        .addColumn("origin", "text", (c) => c.notNull())
        .addColumn("topic", "text", (c) => c.notNull())
        .addColumn("message", "text", (c) => c.notNull())
        .addColumn("created_at", "bigint", (c) => c.notNull())
        .execute();
    },
  },
  // Stored voice transcripts (public-api.md, "Conversations"): one row per conversation (a device's
  // connection) with what the list shows, and its entries in order. Listing reads one index range
  // (device, start time, id) newest first; a conversation's entries are one primary-key range; the
  // retention job reads `last_at`. Both go with their device (cascade).
  "0007_conversations": {
    async up(db: Kysely<any>) {
      await db.schema
        .createTable("conversations")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("public_key", "text", (c) => c.notNull().references("peers.public_key").onDelete("cascade"))
        .addColumn("started_at", "bigint", (c) => c.notNull())
        .addColumn("ended_at", "bigint")
        .addColumn("last_at", "bigint", (c) => c.notNull())
        .addColumn("turns", "integer", (c) => c.notNull())
        .addColumn("entries", "integer", (c) => c.notNull())
        .addColumn("last_text", "text", (c) => c.notNull())
        .execute();
      await db.schema.createIndex("conversations_peer").on("conversations").columns(["public_key", "started_at", "id"]).execute();
      await db.schema.createIndex("conversations_last").on("conversations").column("last_at").execute();
      await db.schema
        .createTable("conversation_entries")
        .addColumn("conversation_id", "text", (c) => c.notNull().references("conversations.id").onDelete("cascade"))
        .addColumn("seq", "integer", (c) => c.notNull())
        .addColumn("turn", "integer", (c) => c.notNull())
        .addColumn("role", "text", (c) => c.notNull())
        .addColumn("text", "text", (c) => c.notNull())
        .addColumn("at", "bigint", (c) => c.notNull())
        .addColumn("interrupted", "integer", (c) => c.notNull())
        .addColumn("tool_name", "text")
        .addColumn("tool_is_error", "integer")
        .addPrimaryKeyConstraint("conversation_entries_pk", ["conversation_id", "seq"])
        .$call((b) => (dialect === "sqlite" ? b.modifyEnd(sql`without rowid`) : b))
        .execute();
    },
  },
  // What a device's agent remembers of its people (public-api.md, "Memory"): one row per device, its
  // `rev` changed by every write so that a rewrite writes only over the text it read. The device's
  // switch and the time of its last forgetting stay on the peer: forgetting deletes the row.
  "0008_memories": {
    async up(db: Kysely<any>) {
      await db.schema
        .createTable("memories")
        .addColumn("public_key", "text", (c) => c.primaryKey().references("peers.public_key").onDelete("cascade"))
        .addColumn("text", "text", (c) => c.notNull())
        .addColumn("rev", "text", (c) => c.notNull())
        .addColumn("updated_at", "bigint", (c) => c.notNull())
        .execute();
      await db.schema
        .alterTable("peers")
        .addColumn("memory_off", "integer", (c) => c.notNull().defaultTo(0))
        .execute();
      await db.schema.alterTable("peers").addColumn("memory_forgotten_at", "bigint").execute();
    },
  },
  // Conversations deleted by the device's controller: a conversation still going (its connection
  // open, a reply finishing) must not write its later entries back. Kept as long as transcripts are.
  "0009_conversation_deletions": {
    async up(db: Kysely<any>) {
      await db.schema
        .createTable("conversation_deletions")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("public_key", "text", (c) => c.notNull().references("peers.public_key").onDelete("cascade"))
        .addColumn("at", "bigint", (c) => c.notNull())
        .execute();
      await db.schema.createIndex("conversation_deletions_at").on("conversation_deletions").column("at").execute();
    },
  },
  // The nodes of the fleet (fleet.md §1): one row per node name, written with its heartbeat (its
  // advertised address, start, state and load), kept after it leaves (`gone`), so that `perch nodes`
  // lists every node and a drain asked of a node from anywhere reaches it through its row.
  "0010_nodes": {
    async up(db: Kysely<any>) {
      await db.schema
        .createTable("nodes")
        .addColumn("name", "text", (c) => c.primaryKey())
        .addColumn("endpoint", "text")
        .addColumn("started_at", "bigint", (c) => c.notNull())
        .addColumn("heartbeat_at", "bigint", (c) => c.notNull())
        .addColumn("state", "text", (c) => c.notNull())
        .addColumn("connections", "integer", (c) => c.notNull().defaultTo(0))
        .addColumn("conversations", "integer", (c) => c.notNull().defaultTo(0))
        .addColumn("cpu", "double precision", (c) => c.notNull().defaultTo(0))
        .addColumn("drain_requested_at", "bigint")
        .execute();
    },
  },
  // What each principal used (usage.md §1): one row per principal (`device:<key>`, `api_key:<name>`,
  // or `all_devices`, the sum of every device's), UTC day and agent or model; several nodes add to
  // a row with one statement each. A device's own limits (`perch peers limits`) stay on its peer.
  "0011_usage": {
    async up(db: Kysely<any>) {
      const counter = (c: any) => c.notNull().defaultTo(0);
      await db.schema
        .createTable("usage_days")
        .addColumn("principal", "text", (c) => c.notNull())
        .addColumn("day", "text", (c) => c.notNull())
        .addColumn("agent", "text", (c) => c.notNull())
        .addColumn("requests", "bigint", counter)
        .addColumn("input_tokens", "bigint", counter)
        .addColumn("output_tokens", "bigint", counter)
        .addColumn("speech_chars", "bigint", counter)
        .addColumn("audio_ms", "bigint", counter)
        .addColumn("tool_calls", "bigint", counter)
        .addColumn("estimated", "integer", counter)
        .addPrimaryKeyConstraint("usage_days_pk", ["principal", "day", "agent"])
        .$call((b) => (dialect === "sqlite" ? b.modifyEnd(sql`without rowid`) : b))
        .execute();
      await db.schema.createIndex("usage_days_day").on("usage_days").column("day").execute();
      await db.schema.alterTable("peers").addColumn("usage_limits", "text").execute();
    },
  },
  // What happened in a turn (voice.md §8): each stored turn's `turn.metrics`, and, for agents that
  // record, each turn's two sides as Ogg Opus, with the time they are deleted at (the agent's
  // `record.retention_days`). Both go with their conversation (cascade); recordings are deleted
  // explicitly first, so that their bytes are overwritten (RecordingRepository).
  "0012_turn_recordings": {
    async up(db: Kysely<any>) {
      await db.schema
        .createTable("conversation_turns")
        .addColumn("conversation_id", "text", (c) => c.notNull().references("conversations.id").onDelete("cascade"))
        .addColumn("turn", "integer", (c) => c.notNull())
        .addColumn("metrics", "text", (c) => c.notNull())
        .addPrimaryKeyConstraint("conversation_turns_pk", ["conversation_id", "turn"])
        .$call((b) => (dialect === "sqlite" ? b.modifyEnd(sql`without rowid`) : b))
        .execute();
      await db.schema
        .createTable("conversation_recordings")
        .addColumn("conversation_id", "text", (c) => c.notNull().references("conversations.id").onDelete("cascade"))
        .addColumn("turn", "integer", (c) => c.notNull())
        .addColumn("side", "text", (c) => c.notNull())
        .addColumn("public_key", "text", (c) => c.notNull())
        .addColumn("audio", dialect === "sqlite" ? "blob" : "bytea", (c) => c.notNull())
        .addColumn("duration_ms", "integer", (c) => c.notNull())
        .addColumn("at", "bigint", (c) => c.notNull())
        .addColumn("expires_at", "bigint", (c) => c.notNull())
        .addPrimaryKeyConstraint("conversation_recordings_pk", ["conversation_id", "turn", "side"])
        .execute();
      await db.schema.createIndex("conversation_recordings_expires").on("conversation_recordings").column("expires_at").execute();
      await db.schema.createIndex("conversation_recordings_peer").on("conversation_recordings").column("public_key").execute();
      // Incompressible audio is kept out of line as it is (PostgreSQL would try to compress it first).
      if (dialect === "postgres") await sql`alter table conversation_recordings alter column audio set storage external`.execute(db);
    },
  },
});

/** Rows of `table` whose `column` names no peer; they belonged to a peer removed before the cascade. */
const orphans = (table: string, column: string) => sql`delete from ${sql.table(table)} where ${sql.ref(column)} not in (select public_key from peers)`;

/**
 * 0002 on PostgreSQL: everything that belongs to a peer gets a foreign key to it with ON DELETE
 * CASCADE (orphans dropped first); a primary session's `target_key` becomes its own key, so one
 * key covers both kinds of session; telemetry moves to integer series ids.
 */
async function peerCascadePostgres(db: Kysely<any>): Promise<void> {
  await sql`update sessions set target_key = public_key where target_key is null`.execute(db);
  await sql`alter table sessions alter column target_key set not null`.execute(db);
  await db.schema.createIndex("sessions_controller").on("sessions").columns(["public_key", "created_at"]).execute();
  for (const [table, column] of belongsToPeer) {
    await orphans(table, column).execute(db);
    await sql`alter table ${sql.table(table)} add constraint ${sql.id(`${table}_peer_fk`)}
      foreign key (${sql.ref(column)}) references peers (public_key) on delete cascade`.execute(db);
  }
  await sql`alter table telemetry_samples rename to telemetry_samples_v1`.execute(db);
  await createTelemetry(db, "postgres");
  await copyTelemetry(db);
}

/** 0002 on SQLite, which cannot add a foreign key to a table: each table is recreated and copied, in one transaction. */
async function peerCascadeSqlite(db: Kysely<any>): Promise<void> {
  await sql`begin immediate`.execute(db);
  try {
    for (const [table] of belongsToPeer) await sql`alter table ${sql.table(table)} rename to ${sql.table(`${table}_v1`)}`.execute(db);
    await sql`alter table telemetry_samples rename to telemetry_samples_v1`.execute(db);
    await createPeerTables(db);
    for (const [table, column] of belongsToPeer) {
      const old = `${table}_v1`;
      const columns = sql.join(peerTableColumns[table]!.map((c) => sql.ref(c)));
      const values =
        table === "sessions" ? sql.raw(peerTableColumns[table]!.map((c) => (c === "target_key" ? "coalesce(target_key, public_key)" : c)).join(", ")) : columns;
      await sql`insert into ${sql.table(table)} (${columns}) select ${values} from ${sql.table(old)} where ${sql.raw(table === "sessions" ? "coalesce(target_key, public_key)" : column)} in (select public_key from peers)`.execute(
        db,
      );
      await sql`drop table ${sql.table(old)}`.execute(db);
    }
    await createPeerIndexes(db);
    await createTelemetry(db, "sqlite");
    await copyTelemetry(db);
    await sql`commit`.execute(db);
  } catch (err) {
    await sql`rollback`.execute(db);
    throw err;
  }
}

/** Tables holding what belongs to a peer, and the column naming it. */
const belongsToPeer: Array<[string, string]> = [
  ["sessions", "target_key"],
  ["device_tokens", "target_key"],
  ["peer_status", "public_key"],
  ["peer_runtime", "public_key"],
  ["contacts", "public_key"],
];

const peerTableColumns: Record<string, string[]> = {
  sessions: ["id", "token_hash", "kind", "public_key", "target_key", "created_at", "expires_at", "revoked_at"],
  device_tokens: ["id", "token_hash", "target_key", "created_at", "expires_at", "consumed_at"],
  peer_status: ["public_key", "document", "updated_at"],
  peer_runtime: ["public_key", "online", "last_seen_at", "last_addr", "rx_bytes", "tx_bytes", "node", "updated_at"],
  contacts: ["public_key", "name", "display_name", "phone_number", "phone_digits", "created_at", "updated_at"],
};

/** The 0001 tables of a peer's data as 0002 has them (SQLite), with their foreign keys. */
async function createPeerTables(db: Kysely<any>): Promise<void> {
  const bigint = "bigint" as const;
  const peer = (c: any) => c.notNull().references("peers.public_key").onDelete("cascade");
  await db.schema
    .createTable("sessions")
    .addColumn("id", "text", (c) => c.primaryKey())
    .addColumn("token_hash", "text", (c) => c.notNull().unique())
    .addColumn("kind", "text", (c) => c.notNull())
    .addColumn("public_key", "text", (c) => c.notNull())
    // The device the session acts on: the target of a Side Control session, the peer itself for a primary one.
    .addColumn("target_key", "text", peer)
    .addColumn("created_at", bigint, (c) => c.notNull())
    .addColumn("expires_at", bigint, (c) => c.notNull())
    .addColumn("revoked_at", bigint)
    .execute();
  await db.schema
    .createTable("device_tokens")
    .addColumn("id", "text", (c) => c.primaryKey())
    .addColumn("token_hash", "text", (c) => c.notNull().unique())
    .addColumn("target_key", "text", peer)
    .addColumn("created_at", bigint, (c) => c.notNull())
    .addColumn("expires_at", bigint, (c) => c.notNull())
    .addColumn("consumed_at", bigint)
    .execute();
  await db.schema
    .createTable("peer_status")
    .addColumn("public_key", "text", (c) => peer(c).primaryKey())
    .addColumn("document", "text", (c) => c.notNull())
    .addColumn("updated_at", bigint, (c) => c.notNull())
    .execute();
  await db.schema
    .createTable("peer_runtime")
    .addColumn("public_key", "text", (c) => peer(c).primaryKey())
    .addColumn("online", "integer", (c) => c.notNull())
    .addColumn("last_seen_at", bigint)
    .addColumn("last_addr", "text")
    .addColumn("rx_bytes", bigint)
    .addColumn("tx_bytes", bigint)
    .addColumn("node", "text")
    .addColumn("updated_at", bigint, (c) => c.notNull())
    .execute();
  await db.schema
    .createTable("contacts")
    .addColumn("public_key", "text", peer)
    .addColumn("name", "text", (c) => c.notNull())
    .addColumn("display_name", "text")
    .addColumn("phone_number", "text")
    .addColumn("phone_digits", "text")
    .addColumn("created_at", bigint, (c) => c.notNull())
    .addColumn("updated_at", bigint, (c) => c.notNull())
    .addPrimaryKeyConstraint("contacts_pk", ["public_key", "name"])
    .addUniqueConstraint("contacts_phone_unique", ["public_key", "phone_digits"])
    .execute();
}

async function createPeerIndexes(db: Kysely<any>): Promise<void> {
  await db.schema.createIndex("sessions_target").on("sessions").columns(["target_key", "created_at"]).execute();
  await db.schema.createIndex("sessions_controller").on("sessions").columns(["public_key", "created_at"]).execute();
  await db.schema.createIndex("sessions_expires").on("sessions").column("expires_at").execute();
  await db.schema.createIndex("device_tokens_target").on("device_tokens").column("target_key").execute();
  await db.schema.createIndex("device_tokens_expires").on("device_tokens").column("expires_at").execute();
}

/**
 * Telemetry with integer series ids: one `telemetry_series` row per (peer, field), and samples of
 * (series, time, value), clustered by series and time (about a quarter of the bytes of rows that
 * repeat the key and the field name).
 */
async function createTelemetry(db: Kysely<any>, dialect: DialectName): Promise<void> {
  await db.schema
    .createTable("telemetry_series")
    .addColumn("id", "integer", (c) => (dialect === "sqlite" ? c.primaryKey() : c.primaryKey().generatedByDefaultAsIdentity()))
    .addColumn("public_key", "text", (c) => c.notNull().references("peers.public_key").onDelete("cascade"))
    .addColumn("field", "text", (c) => c.notNull())
    .addUniqueConstraint("telemetry_series_unique", ["public_key", "field"])
    .execute();
  await db.schema
    .createTable("telemetry_samples")
    .addColumn("series_id", "integer", (c) => c.notNull().references("telemetry_series.id").onDelete("cascade"))
    .addColumn("observed_at", "bigint", (c) => c.notNull())
    .addColumn("value", "double precision", (c) => c.notNull())
    .addPrimaryKeyConstraint("telemetry_samples_series_pk", ["series_id", "observed_at"])
    .$call((b) => (dialect === "sqlite" ? b.modifyEnd(sql`without rowid`) : b))
    .execute();
  await db.schema
    .createTable("telemetry_rollups")
    .addColumn("series_id", "integer", (c) => c.notNull().references("telemetry_series.id").onDelete("cascade"))
    .addColumn("minute", "bigint", (c) => c.notNull())
    .addColumn("n", "integer", (c) => c.notNull())
    .addColumn("total", "double precision", (c) => c.notNull())
    .addColumn("low", "double precision", (c) => c.notNull())
    .addColumn("high", "double precision", (c) => c.notNull())
    .addPrimaryKeyConstraint("telemetry_rollups_pk", ["series_id", "minute"])
    .$call((b) => (dialect === "sqlite" ? b.modifyEnd(sql`without rowid`) : b))
    .execute();
}

async function copyTelemetry(db: Kysely<any>): Promise<void> {
  await sql`insert into telemetry_series (public_key, field)
    select distinct public_key, field from telemetry_samples_v1 where public_key in (select public_key from peers)`.execute(db);
  await sql`insert into telemetry_samples (series_id, observed_at, value)
    select s.id, o.observed_at, o.value from telemetry_samples_v1 o join telemetry_series s on s.public_key = o.public_key and s.field = o.field`.execute(db);
  await sql`drop table telemetry_samples_v1`.execute(db);
  await sql`insert into telemetry_rollups (series_id, minute, n, total, low, high)
    select series_id, (observed_at / 60000) * 60000, count(*), sum(value), min(value), max(value) from telemetry_samples
    where observed_at >= 0 group by series_id, (observed_at / 60000) * 60000`.execute(db);
}

export function migrationProvider(dialect: DialectName): MigrationProvider {
  return { getMigrations: async () => migrations(dialect) };
}
