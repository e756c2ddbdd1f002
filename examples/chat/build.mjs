// Builds the page into dist/: index.html and app.js (one ESM bundle with React and
// sluice-client). `sluice serve --public examples/chat/dist` serves it.
import { build } from "esbuild";
import { copyFile, mkdir } from "node:fs/promises";
import { fileURLToPath } from "node:url";

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
await mkdir(here("./dist"), { recursive: true });
await build({
  entryPoints: [here("./src/main.tsx")],
  outfile: here("./dist/app.js"),
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  minify: true,
  sourcemap: "linked",
  define: { "process.env.NODE_ENV": '"production"' },
  logLevel: "warning",
});
await copyFile(here("./src/index.html"), here("./dist/index.html"));
console.log("built dist/index.html and dist/app.js");
