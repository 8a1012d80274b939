// Documents in and out of the browser: a JSON download made in memory, a JSON file read from an <input>.

/** Offer ``data`` as a JSON file named ``name`` (an object URL, revoked once clicked). */
export function download(name, data) {
  const url = URL.createObjectURL(new Blob([JSON.stringify(data, null, 2)], { type: "application/json" }));
  const link = document.createElement("a");
  link.href = url;
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/** The JSON document in a file input's first file. */
export async function upload(input) {
  const file = input.files && input.files[0];
  if (!file) throw new Error("Choose a JSON file first.");
  try {
    return JSON.parse(await file.text());
  } catch (err) {
    throw new Error(`${file.name} is not JSON: ${err.message}`);
  }
}
