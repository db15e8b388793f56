// A real `failbus dev` for the tests: built from this repository with
// `go build` (or taken from FAILBUS_BIN, which the Go test that runs these
// tests sets), on a free port with a temporary data directory.

import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root: the nearest directory above this file holding go.mod. */
export function repoRoot(): string {
  let d = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(d, "go.mod"))) {
    const up = dirname(d);
    if (up === d) throw new Error("no go.mod above " + fileURLToPath(import.meta.url));
    d = up;
  }
  return d;
}

let built: string | undefined;

/** failbusBinary is FAILBUS_BIN, or a binary built from this repository once per process. */
export function failbusBinary(): string {
  if (process.env.FAILBUS_BIN) return process.env.FAILBUS_BIN;
  if (!built) {
    const dir = mkdtempSync(join(tmpdir(), "failbus-ts-bin-"));
    built = join(dir, "failbus");
    execFileSync("go", ["build", "-o", built, "./cmd/failbus"], { cwd: repoRoot(), stdio: ["ignore", "inherit", "inherit"] });
  }
  return built;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/** A running `failbus dev`. */
export interface Dev {
  url: string;
  dataDir: string;
  proc: ChildProcess;
  /** stop sends SIGTERM and waits for the exit; it returns the exit code. */
  stop(): Promise<number | null>;
  /** stderr so far, for failure messages. */
  log(): string;
}

/** startDev runs `failbus dev` and resolves once it printed its client URL. */
export async function startDev(extra: string[] = []): Promise<Dev> {
  const port = await freePort();
  const dataDir = mkdtempSync(join(tmpdir(), "failbus-ts-dev-"));
  const proc = spawn(failbusBinary(), ["dev", "--port", String(port), "--data", dataDir, "--ops-addr", "127.0.0.1:0", ...extra], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  proc.stderr!.on("data", (b) => (stderr += b));
  const exited = new Promise<number | null>((r) => proc.once("exit", (code) => r(code)));
  const url = await new Promise<string>((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`failbus dev printed no URL within 60s\n${stderr}`)), 60_000);
    proc.stdout!.on("data", (b) => {
      out += b;
      const m = /nats:\/\/127\.0\.0\.1:\d+/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[0]);
      }
    });
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`failbus dev exited (${code}) before printing its URL\n${stderr}`));
    });
  });
  proc.stdout!.resume();
  return {
    url,
    dataDir,
    proc,
    log: () => stderr,
    async stop() {
      if (proc.exitCode === null) proc.kill("SIGTERM");
      const code = await exited;
      rmSync(dataDir, { recursive: true, force: true });
      return code;
    },
  };
}

/** until polls ok every 20 ms until it returns a value, failing after timeoutMs. */
export async function until<T>(what: string, ok: () => Promise<T | undefined> | T | undefined, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await ok();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
