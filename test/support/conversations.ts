import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import pg from "pg";
import type { PerchClient } from "../../src/sdk/client.ts";
import type { TestServer } from "./server.ts";

/** A device (primary session) and a phone paired with it (Side Control session). */
export async function pairPhone(server: TestServer, device: PerchClient = server.client()): Promise<{ device: PerchClient; phone: PerchClient; key: string }> {
  if (!device.accessToken) await device.login();
  const phone = server.client();
  await phone.login({ deviceToken: (await device.createDeviceToken()).token });
  return { device, phone, key: device.publicKey };
}

/** Runs one counting query (`select count(*) as n …`) on the database itself, on a connection of its own. */
export async function countRows(server: TestServer, databaseUrl: string | undefined, query: string, values: Array<string | number> = []): Promise<number> {
  if (!databaseUrl) {
    const db = new DatabaseSync(join(server.dataDir, "perch.db"), { readOnly: true });
    try {
      const sqliteQuery = query.replace(/\$\d+/g, "?");
      return Number((db.prepare(sqliteQuery).get(...values) as { n: number | bigint }).n);
    } finally {
      db.close();
    }
  }
  const c = new pg.Client({ connectionString: databaseUrl });
  await c.connect();
  try {
    return Number((await c.query(query, values)).rows[0].n);
  } finally {
    await c.end();
  }
}

/** Stored rows of the device's conversations and entries: `[conversations, entries]`. */
export async function storedRows(server: TestServer, databaseUrl: string | undefined, key: string): Promise<[number, number]> {
  return [
    await countRows(server, databaseUrl, "select count(*) as n from conversations where public_key = $1", [key]),
    await countRows(
      server,
      databaseUrl,
      "select count(*) as n from conversation_entries where conversation_id in (select id from conversations where public_key = $1)",
      [key],
    ),
  ];
}
