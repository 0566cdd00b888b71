import type { NodeRow, NodeState } from "../store/nodes.ts";
import type { DomainContext } from "./context.ts";
import { NODE_STALE_MS } from "./presence.ts";

/** A node as `perch nodes` shows it (fleet.md §1). */
export interface NodeView {
  name: string;
  endpoint: string | null;
  state: NodeState;
  started_at: string;
  heartbeat_at: string;
  /** Milliseconds since its last heartbeat, by this process's clock. */
  heartbeat_age_ms: number;
  connections: number;
  conversations: number;
  /** The process's CPU over the last 5 s, as a share of one core. */
  cpu: number;
  /** A drain was asked of it (`perch nodes drain`) and it has not left yet. */
  drain_requested: boolean;
}

/** The fleet as the store knows it: every node's row, and drains asked through it. */
export class NodeService {
  private readonly ctx: DomainContext;

  constructor(ctx: DomainContext) {
    this.ctx = ctx;
  }

  /**
   * Every node with the age of its heartbeat; one whose heartbeat is older than the bound that
   * marks its devices offline (`NODE_STALE_MS`) is `gone`, whatever its row last said.
   */
  async list(): Promise<NodeView[]> {
    const now = this.ctx.clock.now();
    const rows = await this.ctx.store.read((r) => r.nodes.list());
    return rows.map((row) => view(row, now));
  }

  /** Asks the node to drain: it reads this from its row at its next heartbeat. False: no such node is serving. */
  async requestDrain(name: string): Promise<boolean> {
    const now = this.ctx.clock.now();
    // A node `perch nodes` shows gone (its heartbeat past the bound) is not asked either.
    return this.ctx.store.transaction((tx) => tx.nodes.requestDrain(name, now, now - NODE_STALE_MS));
  }
}

function view(row: NodeRow, now: number): NodeView {
  const age = Math.max(0, now - Number(row.heartbeat_at));
  const stale = age > NODE_STALE_MS;
  const state = (stale ? "gone" : row.state) as NodeState;
  const gone = state === "gone";
  return {
    name: row.name,
    endpoint: row.endpoint,
    state,
    started_at: new Date(Number(row.started_at)).toISOString(),
    heartbeat_at: new Date(Number(row.heartbeat_at)).toISOString(),
    heartbeat_age_ms: age,
    connections: gone ? 0 : Number(row.connections),
    conversations: gone ? 0 : Number(row.conversations),
    cpu: gone ? 0 : Math.round(Number(row.cpu) * 1000) / 1000,
    drain_requested: !gone && row.drain_requested_at !== null,
  };
}
