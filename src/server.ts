import { Node, type RunningServer, type StartOptions } from "./node/node.ts";

export { EngineHost, type EngineParts, type EngineSettings } from "./node/engines.ts";
export { Node, type RunningServer, type StartOptions } from "./node/node.ts";

/** Checks the configuration, opens the store and the event bus, and wires the node; listens on nothing. */
export function buildServer(o: StartOptions): Promise<Node> {
  return Node.build(o);
}

/** Builds the node and listens: `Node.build(o)` then `listen()`. */
export async function startServer(o: StartOptions): Promise<RunningServer> {
  return (await Node.build(o)).listen();
}
