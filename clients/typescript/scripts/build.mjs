// build.mjs compiles the client to dist/src (with --tests, its tests to
// dist/test too) with the TypeScript compiler of its devDependencies.
//
// It is the package's `prepare` script, which npm runs where those are
// not installed: `npm install ./clients/typescript` (a linked folder)
// gets the folder's dependencies, never its devDependencies, and a `tsc`
// script then failed with "tsc: not found". So when the compiler is
// missing, it installs what package-lock.json pins into the folder first
// (`npm ci`: from npm's cache when offline), then compiles.

import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const dir = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(dir, "node_modules", "typescript", "bin", "tsc");

function run(cmd, args) {
  const r = spawnSync(cmd, args, { cwd: dir, stdio: "inherit", shell: process.platform === "win32" });
  if (r.status !== 0) {
    console.error(`@failbus/client: ${cmd} ${args.join(" ")} failed (${r.error ?? "exit " + r.status})`);
    process.exit(r.status ?? 1);
  }
}

if (!existsSync(tsc)) {
  console.error("@failbus/client: installing its build tools (devDependencies) to compile dist/");
  // npm_execpath is the npm running this script. `npm ci` installs what
  // package-lock.json pins, so it needs only npm's cache when offline.
  const npm = process.env.npm_execpath;
  const args = ["ci", "--include=dev", "--ignore-scripts", "--no-audit", "--no-fund"];
  if (npm && npm.endsWith(".js")) run(process.execPath, [npm, ...args]);
  else run("npm", args);
}
// The package is dist/src; the tests (--tests) are compiled beside it.
run(process.execPath, [tsc, "-p", process.argv.includes("--tests") ? "tsconfig.json" : "tsconfig.build.json"]);
