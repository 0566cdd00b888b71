import { execFile, execFileSync } from "node:child_process";
import { join } from "node:path";
import pg from "pg";

const SCRIPT = join(new URL("../../", import.meta.url).pathname, "scripts/pg-throwaway.sh");

function run(args: string[]): Promise<{ stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    execFile(SCRIPT, args, { timeout: 120_000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`pg-throwaway.sh ${args.join(" ")} failed: ${err.message}\n${stderr}`));
      else resolve({ stdout, stderr });
    });
  });
}

/**
 * A PostgreSQL cluster of a test's own (scripts/pg-throwaway.sh), which the test may restart, halt
 * and end connections of without disturbing any other test's database.
 */
export class OwnCluster {
  readonly url: string;
  readonly dir: string;

  private destroyed = false;
  /** A test process that ends without `destroy()` (a hook that timed out, `--test-force-exit`) still stops its cluster. */
  private readonly atExit = () => {
    if (!this.destroyed) execFileSync(SCRIPT, ["stop", this.dir], { stdio: "ignore", timeout: 60_000 });
  };

  private constructor(url: string, dir: string) {
    this.url = url;
    this.dir = dir;
    process.once("exit", this.atExit);
  }

  static async start(): Promise<OwnCluster> {
    const { stdout, stderr } = await run([]);
    const dir = /^export PERCH_PG_DIR=(.+)$/m.exec(stderr)?.[1];
    if (!dir) throw new Error(`pg-throwaway.sh reported no directory:\n${stderr}`);
    return new OwnCluster(stdout.trim(), dir.replace(/^'(.*)'$/, "$1"));
  }

  /** `pg_ctl restart -m fast`. */
  async restart(): Promise<void> {
    await run(["restart", this.dir]);
  }

  /** `pg_ctl stop -m fast`, keeping the data. */
  async halt(): Promise<void> {
    await run(["halt", this.dir]);
  }

  /** Starts a halted server again. */
  async resume(): Promise<void> {
    await run(["resume", this.dir]);
  }

  /** Ends every other connection to the cluster (`pg_terminate_backend`); returns how many. */
  async terminateAll(): Promise<number> {
    const admin = new pg.Client({ connectionString: this.url });
    await admin.connect();
    try {
      const r = await admin.query(
        "select count(*) filter (where pg_terminate_backend(pid)) as n from pg_stat_activity where pid <> pg_backend_pid() and backend_type = 'client backend'",
      );
      return Number(r.rows[0].n);
    } finally {
      await admin.end();
    }
  }

  /** Runs one query on a connection of its own. */
  async query<R extends pg.QueryResultRow = any>(text: string, values?: unknown[]): Promise<R[]> {
    const c = new pg.Client({ connectionString: this.url });
    await c.connect();
    try {
      return (await c.query<R>(text, values as any[])).rows;
    } finally {
      await c.end();
    }
  }

  async destroy(): Promise<void> {
    if (this.destroyed) return;
    this.destroyed = true;
    process.off("exit", this.atExit);
    await run(["stop", this.dir]);
  }
}
