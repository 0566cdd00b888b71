import { readdirSync, readFileSync } from "node:fs";

/** This process's child processes (name and pid), from /proc. */
export function childProcesses(): Array<{ pid: number; name: string }> {
  const found: Array<{ pid: number; name: string }> = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      const close = stat.lastIndexOf(")");
      const ppid = Number(stat.slice(close + 2).split(" ")[1]);
      if (ppid === process.pid) found.push({ pid: Number(entry), name: stat.slice(stat.indexOf("(") + 1, close) });
    } catch {}
  }
  return found;
}
