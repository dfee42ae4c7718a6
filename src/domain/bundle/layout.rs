//! Step 1, structure half: layout detection and the allowed contents of docs/api.md §9.1.

use std::collections::{BTreeMap, BTreeSet};

use super::structure::SafeEntry;
use super::{codes, Layout, Problem};

pub(super) const MANIFEST_FILE: &str = "manifest.json";
pub(super) const EXT_FILE: &str = "ext.json";
pub(super) const SCHEMA_FILE: &str = "schema.json";
pub(super) const UI_FILE: &str = "ui.json";
const RENDERER_FILE: &str = "renderer.jsx";

#[derive(Debug)]
pub(super) struct LayoutAnalysis {
    pub layout: Layout,
    pub problems: Vec<Problem>,
    /// Form folder names under the layout's forms root.
    pub form_folders: BTreeSet<String>,
    /// Names of the `renderers/<name>/` folders.
    pub renderers: BTreeSet<String>,
}

pub(super) fn analyse_layout(entries: &[SafeEntry]) -> LayoutAnalysis {
    let files: BTreeSet<&str> =
        entries.iter().filter(|entry| !entry.is_dir).map(|entry| entry.path.as_str()).collect();
    let has_app_folder =
        entries.iter().any(|entry| entry.path.starts_with("app/") || (entry.is_dir && entry.path == "app"));
    let layout = detect_layout(&files, has_app_folder);
    let walk = TopLevelWalk::run(entries, layout);

    let mut problems = walk.renderer_problems;
    problems.extend(walk.unexpected_tops.into_iter().map(unexpected_top_problem));
    problems.extend(walk.forms_problems);
    problems.extend(missing_index_problem(layout, &files, has_app_folder));
    if layout == Layout::AppForms && !walk.top_form_folders.is_empty() {
        problems.push(Problem::new(
            "forms/",
            codes::MIXED_FORM_LAYOUTS,
            "form folders exist under both forms/ and app/forms/",
        ));
    }
    problems.extend(renderers_without_file(&files, &walk.renderer_folders));

    let form_folders = match layout {
        Layout::AppForms => walk.app_form_folders,
        Layout::Default | Layout::Legacy => walk.top_form_folders,
    };
    LayoutAnalysis { layout, problems, form_folders, renderers: walk.renderer_folders }
}

/// A root `index.html` without `app/` is the legacy layout; form files under `app/forms/`
/// make the app-forms layout.
fn detect_layout(files: &BTreeSet<&str>, has_app_folder: bool) -> Layout {
    let app_forms_hold_forms = files.iter().any(|path| {
        let segments: Vec<&str> = path.split('/').collect();
        matches!(segments.as_slice(), ["app", "forms", _, SCHEMA_FILE | UI_FILE])
    });
    if !has_app_folder && files.contains("index.html") {
        Layout::Legacy
    } else if app_forms_hold_forms {
        Layout::AppForms
    } else {
        Layout::Default
    }
}

/// What one pass over the entries finds under each top-level name.
#[derive(Default)]
struct TopLevelWalk {
    /// Loose files directly under `renderers/`.
    renderer_problems: Vec<Problem>,
    unexpected_tops: BTreeSet<String>,
    forms_problems: Vec<Problem>,
    // Form folders found under `forms/` and under `app/forms/` (the latter only
    // counts as a forms root in the app-forms layout).
    top_form_folders: BTreeSet<String>,
    app_form_folders: BTreeSet<String>,
    renderer_folders: BTreeSet<String>,
}

impl TopLevelWalk {
    fn run(entries: &[SafeEntry], layout: Layout) -> Self {
        let mut walk = TopLevelWalk::default();
        for entry in entries {
            let segments: Vec<&str> = entry.path.split('/').collect();
            if let Some((&top, rest)) = segments.split_first() {
                walk.entry(entry, layout, top, rest);
            }
        }
        walk
    }

    fn entry(&mut self, entry: &SafeEntry, layout: Layout, top: &str, rest: &[&str]) {
        let is_folder_content = entry.is_dir || !rest.is_empty();
        let allowed_top = match top {
            MANIFEST_FILE => !is_folder_content,
            "app" | "forms" | "renderers" => is_folder_content,
            "index.html" => !is_folder_content && layout == Layout::Legacy,
            "assets" => is_folder_content && layout == Layout::Legacy,
            _ => false,
        };
        if !allowed_top {
            // One problem per top-level name; a wrapping folder would otherwise
            // produce one per file.
            let shown = if is_folder_content { format!("{top}/") } else { top.to_owned() };
            self.unexpected_tops.insert(shown);
            return;
        }
        match top {
            "forms" => {
                self.forms_problems.extend(check_forms_root_entry(entry, "forms", rest));
                self.top_form_folders.extend(form_folder_of(entry, rest).map(str::to_owned));
            }
            "app" if layout == Layout::AppForms && rest.first() == Some(&"forms") => {
                let forms_rest = &rest[1..];
                self.forms_problems.extend(check_forms_root_entry(entry, "app/forms", forms_rest));
                self.app_form_folders.extend(form_folder_of(entry, forms_rest).map(str::to_owned));
            }
            "renderers" => match rest {
                [] => {}
                [_loose_file] if !entry.is_dir => self.renderer_problems.push(Problem::new(
                    &entry.path,
                    codes::UNEXPECTED_ENTRY,
                    "files directly under renderers/ are not allowed; use renderers/<name>/",
                )),
                [name, ..] => {
                    self.renderer_folders.insert((*name).to_owned());
                }
            },
            _ => {}
        }
    }
}

fn unexpected_top_problem(top: String) -> Problem {
    let message = if top == "index.html" {
        "a root index.html is not allowed next to app/".to_owned()
    } else if top == "__MACOSX/" {
        "macOS resource forks (__MACOSX/) are not allowed".to_owned()
    } else {
        format!("{top} is not allowed at the top level of a bundle")
    };
    Problem::new(top, codes::UNEXPECTED_ENTRY, message)
}

fn missing_index_problem(layout: Layout, files: &BTreeSet<&str>, has_app_folder: bool) -> Option<Problem> {
    let index_present = match layout {
        Layout::Legacy => files.contains("index.html"),
        Layout::Default | Layout::AppForms => files.contains("app/index.html"),
    };
    (!index_present).then(|| {
        let path = if has_app_folder { "app/index.html" } else { "index.html" };
        Problem::new(
            path,
            codes::MISSING_APP_INDEX,
            "the bundle has neither app/index.html nor (legacy layout) index.html",
        )
    })
}

/// Every `renderers/<name>/` folder needs its `renderer.jsx`.
fn renderers_without_file(files: &BTreeSet<&str>, renderer_folders: &BTreeSet<String>) -> Vec<Problem> {
    let renderer_files: BTreeMap<&str, ()> = files
        .iter()
        .filter_map(|path| {
            let segments: Vec<&str> = path.split('/').collect();
            match segments.as_slice() {
                ["renderers", name, RENDERER_FILE] => Some((*name, ())),
                _ => None,
            }
        })
        .collect();
    renderer_folders
        .iter()
        .filter(|name| !renderer_files.contains_key(name.as_str()))
        .map(|name| {
            Problem::new(
                format!("renderers/{name}/"),
                codes::RENDERER_INVALID,
                format!("renderer {name} has no {RENDERER_FILE}"),
            )
        })
        .collect()
}

/// The allowed entries of a forms root: `ext.json`, `<type>/`,
/// `<type>/schema.json` and `<type>/ui.json`.
fn check_forms_root_entry(entry: &SafeEntry, root: &str, relative: &[&str]) -> Option<Problem> {
    let allowed = match relative {
        [] => entry.is_dir,
        [EXT_FILE] => !entry.is_dir,
        [_form_folder] => entry.is_dir,
        [_form_folder, SCHEMA_FILE | UI_FILE] => !entry.is_dir,
        _ => false,
    };
    (!allowed).then(|| {
        Problem::new(
            &entry.path,
            codes::UNEXPECTED_ENTRY,
            format!("{root}/ may hold only {EXT_FILE} and <formType>/{SCHEMA_FILE}, <formType>/{UI_FILE}"),
        )
    })
}

/// The form folder an entry of a forms root belongs to, if any.
fn form_folder_of<'a>(entry: &SafeEntry, relative: &[&'a str]) -> Option<&'a str> {
    match relative {
        [folder] if entry.is_dir => Some(folder),
        [folder, _, ..] => Some(folder),
        _ => None,
    }
}
