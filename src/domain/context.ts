import type { KeyObject } from "node:crypto";
import type { Config } from "../config/config.ts";
import type { KeyPair } from "../crypto/keys.ts";
import type { Store } from "../store/index.ts";
import type { DomainEvents } from "./changes.ts";
import type { Clock } from "./clock.ts";

/** What every domain service is built from. */
export interface DomainContext {
  store: Store;
  clock: Clock;
  config: Config;
  serverKey: KeyPair & { privateKeyObject: KeyObject; publicKeyText: string };
  /** Where committed changes are published (this node's subscribers and, on PostgreSQL, every node's). */
  events: DomainEvents;
}

export const DAY_MS = 24 * 60 * 60 * 1000;
