/** Who is calling, once authenticated. */
export type Principal =
  | { kind: "primary"; publicKey: string; sessionId?: string }
  | { kind: "side_control"; publicKey: string; targetKey: string; sessionId: string };

export type PrimaryPrincipal = Extract<Principal, { kind: "primary" }>;
export type SideControlPrincipal = Extract<Principal, { kind: "side_control" }>;
