/** Why a request to `server` never got an answer, in words (`fetch failed` alone says nothing). */
export function unreachable(server: string, err: unknown): string {
  const cause = (err as { cause?: { code?: string; message?: string } }).cause;
  const code = cause?.code ?? (err as { code?: string }).code;
  const why =
    code === "ECONNREFUSED"
      ? "connection refused (is `perch serve` running there?)"
      : code === "ENOTFOUND" || code === "EAI_AGAIN"
        ? "unknown host"
        : code === "ETIMEDOUT" || code === "UND_ERR_CONNECT_TIMEOUT"
          ? "no answer (timed out)"
          : (cause?.message ?? (err as Error).message);
  return `cannot reach ${server}: ${why}${code && !why.includes(code) ? ` (${code})` : ""}`;
}
