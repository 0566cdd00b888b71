/** Who is calling, once authenticated. */
export type Principal =
  | { kind: "primary"; publicKey: string; sessionId?: string }
  | { kind: "side_control"; publicKey: string; targetKey: string; sessionId: string };

export type PrimaryPrincipal = Extract<Principal, { kind: "primary" }>;
export type SideControlPrincipal = Extract<Principal, { kind: "side_control" }>;

/**
 * Set by the WebRTC transport on the socket of a request that arrived on a service stream: the
 * connection's authenticated key. A TCP socket never carries it.
 */
export const CONNECTION_PRINCIPAL = Symbol.for("perch.connection-principal");

export interface ConnectionIdentity {
  publicKey: string;
}
