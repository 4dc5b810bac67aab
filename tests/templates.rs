//! The template a served model renders its prompts with is the one its
//! training data was rendered with: `trainers/chatml_tools.serve.jinja`
//! (what `llama-server --chat-template-file` and vLLM's `--chat-template`
//! load) is `trainers/chatml_tools.jinja` (what trainers/lora_sft.py trains
//! with) without the two `{% generation %}` markers, which only
//! transformers knows. An edit to one file and not the other fails here
//! before a real cycle serves prompts its model was not trained on.

use std::path::Path;

/// The template's text without its leading `{#- ... -#}` comment.
fn body(path: &str) -> String {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let end = text.find("-#}").map_or(0, |i| i + 3);
    assert!(
        text.trim_start().starts_with("{#-"),
        "{path} starts with its comment"
    );
    text[end..].to_string()
}

#[test]
fn served_template_is_the_trained_one_without_generation_markers() {
    let trained = body("trainers/chatml_tools.jinja");
    let markers = ["{%- generation %}", "{%- endgeneration %}"];
    for m in markers {
        assert_eq!(
            trained.matches(m).count(),
            1,
            "the training template marks {m} once"
        );
    }
    let without: Vec<&str> = trained
        .split('\n')
        .filter(|l| !markers.contains(&l.trim()))
        .collect();
    assert_eq!(
        body("trainers/chatml_tools.serve.jinja"),
        without.join("\n"),
        "trainers/chatml_tools.serve.jinja must be trainers/chatml_tools.jinja without the generation markers"
    );
}
