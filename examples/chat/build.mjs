// Builds the page into dist/: index.html and app.js (one ESM bundle with React and
// sluice-client). `sluice serve --public examples/chat/dist` serves it.
import { build } from "esbuild";
import { copyFile, mkdir } from "node:fs/promises";
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
const require = createRequire(import.meta.url);

// sluice-client is linked from ../../sdk/ts (a "file:" dependency), whose own node_modules may
// hold a React of its own (for its tests): two Reacts in one page break every hook. So `react`
// and `react-dom` resolve from this package, wherever they are imported from.
const oneReact = {
  name: "one-react",
  setup(b) {
    b.onResolve({ filter: /^react(-dom)?(\/.*)?$/ }, (args) => ({ path: require.resolve(args.path) }));
  },
};
if (!existsSync(here("./node_modules/sluice-client/dist/index.js"))) {
  console.error("sluice-client is not built: run (cd ../../sdk/ts && npm ci && npm run build), then npm ci here");
  process.exit(1);
}
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
  plugins: [oneReact],
});
await copyFile(here("./src/index.html"), here("./dist/index.html"));
console.log("built dist/index.html and dist/app.js");
