(fill, ...shown) => shown.map((value, i) => {
  // After each tick, per field (`fill.ids`' names, in order): the model's value where untouched, else nothing (undefined).
  if (!fill || !fill.values) return undefined;
  const name = Object.keys(fill.ids)[i], id = fill.ids[name], box = document.getElementById(id);  // none: a tab not shown yet
  const theirs = (window.dgemmaTouched || new Set()).has(id) || (box && box.contains(document.activeElement));
  return !theirs && JSON.stringify(value) === JSON.stringify(fill.built[name]) ? fill.values[name] : undefined;
})
