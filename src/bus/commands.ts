import { type BusMessage, type EventBus, topics } from "./bus.ts";

export type CommandHandler = (args: BusMessage) => Promise<BusMessage | undefined> | BusMessage | undefined;

/** A command that got no answer, or whose handler failed on the node that ran it. */
export class CommandError extends Error {
  readonly reason: "timeout" | "no_handler" | "failed";
  constructor(reason: CommandError["reason"], message: string) {
    super(message);
    this.reason = reason;
  }
}

const DEFAULT_TIMEOUT_MS = 3_000;

/**
 * Request and reply over the bus, to the node that holds something (a device's connection):
 * `call(node, name, args)` publishes on that node's topic; the node that runs `handle(name, …)`
 * publishes the result on the caller's reply topic. Handlers return a small JSON object or
 * `undefined` (which the caller reads as "not here", e.g. the connection moved on).
 */
export class Commands {
  private readonly bus: EventBus;
  private readonly handlers = new Map<string, CommandHandler>();
  private readonly pending = new Map<number, { resolve(v: BusMessage | undefined): void; reject(e: Error): void; timer: NodeJS.Timeout }>();
  private next = 0;
  private readonly unsubscribe: Array<() => void>;

  /** `nodeName`: the node this process answers for (undefined: it only calls, like the command line). */
  constructor(bus: EventBus, nodeName: string | undefined) {
    this.bus = bus;
    this.unsubscribe = [bus.subscribe(topics.replies(bus.instance), { message: (m) => this.replied(m) })];
    if (nodeName !== undefined) this.unsubscribe.push(bus.subscribe(topics.node(nodeName), { message: (m) => this.requested(m) }));
  }

  handle(name: string, handler: CommandHandler): void {
    this.handlers.set(name, handler);
  }

  /** Runs `name` on `node`; rejects with a CommandError on timeout, a missing handler or a failure there. */
  call(node: string, name: string, args: BusMessage = {}, timeoutMs = DEFAULT_TIMEOUT_MS): Promise<BusMessage | undefined> {
    const id = this.next++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new CommandError("timeout", `node ${node} did not answer ${name} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      this.bus.publish(topics.node(node), { kind: "command", name, id, from: this.bus.instance, args });
    });
  }

  close(): void {
    for (const u of this.unsubscribe) u();
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      p.reject(new CommandError("timeout", "the bus closed"));
      this.pending.delete(id);
    }
  }

  private requested(m: BusMessage): void {
    if (m.kind !== "command" || typeof m.name !== "string" || typeof m.from !== "string" || typeof m.id !== "number") return;
    const reply = (r: BusMessage) => this.bus.publish(topics.replies(m.from as string), { kind: "reply", id: m.id, ...r });
    const handler = this.handlers.get(m.name);
    if (!handler) {
      reply({ error: "no_handler" });
      return;
    }
    const args = typeof m.args === "object" && m.args !== null ? (m.args as BusMessage) : {};
    Promise.resolve()
      .then(() => handler(args))
      .then(
        (value) => reply(value === undefined ? {} : { value }),
        (err: unknown) => reply({ error: "failed", message: String((err as Error)?.message ?? err) }),
      )
      .catch(() => {});
  }

  private replied(m: BusMessage): void {
    if (m.kind !== "reply" || typeof m.id !== "number") return;
    const p = this.pending.get(m.id);
    if (!p) return;
    this.pending.delete(m.id);
    clearTimeout(p.timer);
    if (m.error === "no_handler") p.reject(new CommandError("no_handler", "the node has no handler for this command"));
    else if (m.error !== undefined) p.reject(new CommandError("failed", String(m.message ?? m.error)));
    else p.resolve(m.value as BusMessage | undefined);
  }
}
