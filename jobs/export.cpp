// The export job (jobs/export.h).
#include "jobs/export.h"

#include "jobs/sample.h"

namespace nl {

ExportResult run_export(const std::string& checkpoint, const ExportOptions& options) {
    TrainCheckpoint ck = load_train_checkpoint(checkpoint);
    check_exportable(ck.config.model, options.to);  // before anything else is done
    const std::vector<uint32_t> chars = ck.vocab ? ck.vocab->codepoints() : std::vector<uint32_t>{};
    export_model(*ck.model, chars, options);
    ExportResult result;
    result.source = ck.path;
    result.step = ck.info.step;
    result.parameters = count_parameters(*ck.model);
    result.tokenizer = !chars.empty();
    result.architecture = options.to == "hf" ? hf_class_name(hf_architecture(ck.config.model)) : "llama";
    result.out = options.out;
    return result;
}

}  // namespace nl
