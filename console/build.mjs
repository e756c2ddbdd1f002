// Builds the console into the three files the server embeds (crates/server/assets/console):
// index.html, console.js (minified, no source map) and console.css. Deterministic: the same
// sources give the same bytes, and the test checks the committed files are what this builds.
import { build } from "esbuild";
import { execFileSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "crates", "server", "assets", "console");
mkdirSync(out, { recursive: true });

// The console uses the TypeScript SDK (`sluice-client`, linked from ../sdk/ts), whose built
// `dist/` is not committed: install its dependencies (again when its lockfile is newer) and
// build it first.
const sdk = join(here, "..", "sdk", "ts");
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const installed = join(sdk, "node_modules", ".package-lock.json");
if (!existsSync(installed) || statSync(installed).mtimeMs < statSync(join(sdk, "package-lock.json")).mtimeMs) {
  execFileSync(npm, ["ci", "--no-audit", "--no-fund"], { cwd: sdk, stdio: "inherit" });
}
execFileSync(npm, ["run", "--silent", "build"], { cwd: sdk, stdio: "inherit" });

await build({
  entryPoints: [join(here, "src", "main.tsx")],
  outfile: join(out, "console.js"),
  bundle: true,
  minify: true,
  sourcemap: false,
  format: "iife",
  target: ["es2020"],
  jsx: "automatic",
  legalComments: "none",
  define: { "process.env.NODE_ENV": '"production"' },
  logLevel: "warning",
});
copyFileSync(join(here, "src", "index.html"), join(out, "index.html"));
copyFileSync(join(here, "src", "console.css"), join(out, "console.css"));

const kb = (f) => (statSync(join(out, f)).size / 1024).toFixed(1);
const js = statSync(join(out, "console.js")).size;
console.log(`console: console.js ${kb("console.js")} KiB, console.css ${kb("console.css")} KiB, index.html ${kb("index.html")} KiB`);
if (js > 400 * 1024) {
  console.error(`console.js is ${js} bytes, over the 400 KiB budget`);
  process.exit(1);
}
