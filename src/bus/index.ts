import { type EventBus, InProcessBus } from "./bus.ts";
import { PgEventBus } from "./postgres.ts";
import { type Persist, SqliteBus } from "./sqlite-feed.ts";

export { type BusMessage, type EventBus, InProcessBus, MAX_MESSAGE_BYTES, type Subscriber, topics } from "./bus.ts";
export { CommandError, Commands } from "./commands.ts";
export { PgEventBus } from "./postgres.ts";
export { SqliteBus } from "./sqlite-feed.ts";

export interface OpenBusOptions {
  /** Whether this process receives other nodes' messages (false: it only publishes, like the command line). */
  listen?: boolean;
  log?: { warn(obj: object, msg: string): void; info?(obj: object, msg: string): void };
  /** On SQLite, the store's file and how often to look for other processes' messages in it (`SqliteBus`; 0: never). */
  sqlite?: { file: string | undefined; pollMs: number; persist?: Persist };
}

/**
 * The bus for a store URL: on PostgreSQL (`postgres://…`) one shared by every node of the
 * database, connected before it returns; otherwise this process's own.
 */
export async function openEventBus(databaseUrl: string | undefined, o: OpenBusOptions = {}): Promise<EventBus> {
  if (databaseUrl && /^postgres(ql)?:\/\//.test(databaseUrl)) {
    const bus = new PgEventBus({ url: databaseUrl, ...o });
    await bus.start();
    return bus;
  }
  const onError = (err: unknown) => o.log?.warn({ err }, "an event subscriber failed");
  const file = o.sqlite?.file;
  if (file && o.listen !== false && o.sqlite && o.sqlite.pollMs > 0)
    return new SqliteBus({ file, pollMs: o.sqlite.pollMs, onError, ...(o.sqlite.persist ? { persist: o.sqlite.persist } : {}) });
  return new InProcessBus(onError);
}
