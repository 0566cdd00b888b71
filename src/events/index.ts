import { type EventBus, InProcessBus } from "./bus.ts";
import { PgEventBus } from "./postgres.ts";

export { type BusMessage, type EventBus, InProcessBus, MAX_MESSAGE_BYTES, type Subscriber, topics } from "./bus.ts";
export { CommandError, Commands } from "./commands.ts";
export { PgEventBus } from "./postgres.ts";

export interface OpenBusOptions {
  /** Whether this process receives other nodes' messages (false: it only publishes, like the command line). */
  listen?: boolean;
  log?: { warn(obj: object, msg: string): void; info?(obj: object, msg: string): void };
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
  return new InProcessBus((err) => o.log?.warn({ err }, "an event subscriber failed"));
}
